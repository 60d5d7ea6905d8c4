"""``hypic-agent``: serve | generate | models | bench."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from hypic_agent.config import MODES, Settings
from hypic_agent.config_docs import REGENERATE, current_rows, env_value, help_epilog
from hypic_agent.config_docs import markdown as config_markdown
from hypic_agent.errors import HypicError
from hypic_agent.runtime.models.cli import models_app
from hypic_agent.startup import LOGGER as STARTUP_LOGGER
from hypic_agent.startup import PortError, StartupLog, hold_port

app = typer.Typer(
    help="HYPIC position-independent segment caching for hybrid-attention LLMs.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(models_app, name="models", help="List and fetch models.")
err = Console(stderr=True)


def _fail(message: str, code: int, kind: str = "") -> typer.Exit:
    """Print ``error: message`` on stderr (the message is not rich markup); the exit to raise."""
    err.print(f"[red]error{f' ({kind})' if kind else ''}:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _settings(model: str | None, device: str | None) -> Settings:
    s = Settings()
    updates = {k: v for k, v in {"model": model, "device": device}.items() if v}
    return s.model_copy(update=updates) if updates else s


@app.command()
def generate(
    prompt: str = typer.Option(..., "--prompt", "-p", help="the question (the uncached suffix of the prompt)"),
    segment: list[Path] = typer.Option([], "--segment", "-s", help="a text file sent as one segment (repeatable)"),
    kind: list[str] = typer.Option(
        [],
        help="kind of the --segment files, once for all or once per file: document | system | skill | memory | text",
    ),
    mode: str | None = typer.Option(None, help=f"{' | '.join(MODES)} (default: the server's, hypic)"),
    seam: str | None = typer.Option(
        None, help="recomputed tokens per segment: 0, a fraction (0, 1], a count (8), or auto (HYPIC_SEAM_BUDGET)"
    ),
    url: str | None = typer.Option(None, help="send the request to a running server (no model load here)"),
    api_key: str | None = typer.Option(None, "--api-key", help="bearer key for --url"),
    model: str | None = typer.Option(None, help="local run: model name/path (default: as for the server)"),
    device: str | None = typer.Option(None, help="local run: auto | cpu | cuda | cuda:N"),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1),
    temperature: float = typer.Option(0.0, min=0.0),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0),
    top_k: int = typer.Option(0, "--top-k", min=0),
    raw: bool = typer.Option(False, help="local run: no chat template, complete the prompt text as is"),
) -> None:
    """Print a completion of PROMPT after the --segment files (streamed), then its usage on stderr.

    With --url the request goes to a running `hypic-agent serve` (its cache persists between
    calls); without, the model is loaded here and the server's app runs in-process."""
    import httpx

    from hypic_agent import cli_generate as g

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger(STARTUP_LOGGER).setLevel(logging.INFO)
    settings = _settings(model, device)
    try:  # every check that needs no model, before anything is loaded
        req = g.check_request(
            prompt=prompt, files=segment, kinds=kind, mode=mode, seam=seam, url=url, raw=raw,
            local_only={"model": model, "device": device},
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
        )  # fmt: skip
        if url is None:
            g.check_model(settings)
    except (g.BadArgument, HypicError) as e:
        raise _fail(e.message if isinstance(e, HypicError) else str(e), 2) from e
    try:
        if url is not None:
            with g.remote_client(url, api_key) as client:
                line = g.stream_completion(client, req, sys.stdout)
        else:
            from hypic_agent.runtime.loader import load_engine

            with StartupLog() as progress:
                engine = load_engine(settings, progress=progress)
                progress.done(f"model {engine.name} ready on {engine.device}")
            if raw:
                line = g.raw_completion(engine, req, settings.seed, sys.stdout)
            else:
                with g.local_client(settings, engine) as client:
                    line = g.stream_completion(client, req, sys.stdout)
    except HypicError as e:
        raise _fail(e.message, 1, e.type) from e
    except g.ServerError as e:
        raise _fail(e.message, 1, e.kind) from e
    except httpx.HTTPError as e:  # the transport: unreachable, timed out, cut off
        raise _fail(g.transport_error_message(e, url), 1) from e
    err.print(escape(line), style="dim", highlight=False, soft_wrap=True)


def _env(name: str) -> str:
    """``(HYPIC_PORT; default 8000)``: a serve option's variable and default, read from ``Settings``."""
    field = Settings.model_fields[name]
    default = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    return f"(HYPIC_{name.upper()}; default {env_value(default)})"


@app.command("config")
def config_cmd(
    markdown: bool = typer.Option(
        False, "--markdown", help=f"print docs/configuration.md instead (regenerate it: {REGENERATE})"
    ),
) -> None:
    """Every setting: its environment variable, the value in effect here and what it does."""
    if markdown:
        sys.stdout.write(config_markdown())
        return
    try:
        settings = Settings()
    except ValueError as e:  # a variable that does not parse: say which
        raise _fail(f"the environment's settings do not validate: {e}", 2) from e
    for row, value in current_rows(settings):
        changed = "" if value == row.default else f"   (default {row.default})"
        typer.echo(f"{row.env}={value}{changed}")
        typer.echo(f"    {row.type}" + (f": {row.description}" if row.description else ""))


@app.command(epilog=help_epilog())
def serve(
    host: str | None = typer.Option(None, help=f"bind address {_env('host')}"),
    port: int | None = typer.Option(None, help=f"port {_env('port')}; checked before the model loads"),
    model: str | None = typer.Option(
        None, help=f"catalog name, HF folder, .gguf file or tiny:<arch> {_env('model')}; see `hypic-agent models list`"
    ),
    device: str | None = typer.Option(None, help=f"auto | cpu | cuda | cuda:N {_env('device')}"),
    prewarm: str | None = typer.Option(None, help="JSON list of segments to register + pre-warm before serving"),
    tenant: str = typer.Option("default", help="tenant that owns the --prewarm segments"),
    scatter_workers: int | None = typer.Option(
        None,
        "--scatter-workers",
        min=1,
        help=f"worker processes that build cold segments, 1 = in process {_env('scatter_workers')}",
    ),
    devices: str | None = typer.Option(
        None,
        help="the scatter workers' devices, comma-separated: cuda:1,cuda:2 (HYPIC_SCATTER_DEVICES, a JSON list; "
        "default: the CPU on CPU, every GPU but rank 0's on CUDA)",
    ),
    split_segment_tokens: int | None = typer.Option(
        None,
        "--split-segment-tokens",
        min=0,
        help="cut segments longer than this into cached pieces of this many tokens (built in parallel; 0 = off) "
        + _env("split_segment_tokens"),
    ),
) -> None:
    """Start the HTTP API server (segment-aware generate, segments store, OpenAI-compatible chat).

    Every setting is an environment variable (listed below); the options override theirs."""
    from hypic_agent.api.serve import run_server
    from hypic_agent.runtime.workers.devices import DeviceError
    from hypic_agent.runtime.workers.pool import WorkerStartError

    if prewarm is not None and not Path(prewarm).is_file():
        raise _fail(f"--prewarm {prewarm}: no such file", 2)
    try:
        settings = _settings(model, device)
        updates: dict[str, object] = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
        if scatter_workers is not None:
            updates["scatter_workers"] = scatter_workers
        if split_segment_tokens is not None:
            updates["split_segment_tokens"] = split_segment_tokens
        if devices is not None:
            updates["scatter_devices"] = [d.strip() for d in devices.split(",") if d.strip()]
        settings = settings.model_copy(update=updates) if updates else settings
        try:  # bound before the load and held until served on: a busy port fails at once, and stays ours
            sock = hold_port(settings.host, settings.port)
        except PortError as e:
            raise _fail(str(e), 2) from e
        with sock:
            run_server(settings, prewarm=Path(prewarm) if prewarm else None, tenant=tenant, sock=sock)
    except HypicError as e:
        err.print(f"[red]error ({e.type}):[/red] {e.message}")
        raise typer.Exit(2) from e
    except (DeviceError, WorkerStartError) as e:
        raise _fail(f"scatter workers: {e}", 2) from e


@app.command()
def distill(
    out: str = typer.Option(..., "--out", help="run folder: corpus/, ckpt/ (resumable), model/ (the result)"),
    steps: int | None = typer.Option(
        None, help="total optimizer steps (default 300; 30 with --tiny); 0 = as many as --time-budget allows"
    ),
    batch: int = typer.Option(16, help="sequences per step"),
    seq: int = typer.Option(2048, help="tokens per sequence"),
    resume: bool = typer.Option(False, help="continue from <out>/ckpt"),
    device: str = typer.Option("auto", help="auto | cpu | cuda | cuda:N"),
    tiny: bool = typer.Option(False, help="tiny random Llama teacher on CPU: the whole pipeline in seconds"),
    teacher: str = typer.Option("smollm2-135m-instruct", help="catalog name, Llama .gguf file or HF folder"),
    data: str | None = typer.Option(None, help="token corpus folder (built there if missing; default <out>/corpus)"),
    shared_data: str | None = typer.Option(None, help="benchmark data folder whose passages join the corpus"),
    lr: float = typer.Option(1e-3),
    warmup: int = typer.Option(30),
    hidden_weight: float = typer.Option(0.0, help="weight of the per-layer hidden-state MSE"),
    local_steps: int = typer.Option(0, help="first steps train each layer alone on teacher inputs"),
    train: str = typer.Option("mixers", help="gdn | mixers | mixers+norms | all"),
    gdn: str = typer.Option("auto", help="training GDN kernel: auto | torch | fla (fla needs triton>=3.7.1 on Hopper)"),
    compile: bool = typer.Option(False, "--compile", help="torch.compile the torch GDN kernel"),
    gdn_chunk: int = typer.Option(64, help="chunk length of the torch GDN kernel"),
    grad_checkpoint: bool = typer.Option(False, help="recompute layers in backward (less memory)"),
    time_budget: float | None = typer.Option(None, help="seconds of training in total (all resumed runs)"),
    process_budget: float | None = typer.Option(None, help="seconds of training in this process"),
    init_from: str | None = typer.Option(None, help="start from an exported model folder instead of converting"),
    stop_at: int | None = typer.Option(None, help="stop this run at this step (resume later; schedule spans --steps)"),
    ckpt_every: int = typer.Option(50),
    eval_tokens: int = typer.Option(262144, help="held-out tokens for perplexity / KL / top-1"),
    conv_tap: float | None = typer.Option(1.0, help="GDN conv current-token tap at init (<=0: per-head calibrated)"),
    attention_layers: str = typer.Option(
        "",
        "--attention-layers",
        help="layers kept as full attention, e.g. '1,3,5' (at most half; python -m hypic_agent.training.select_layers "
        "prints a measured choice); empty = every 4th (3,7,11,...)",
    ),
    export_dtype: str = typer.Option("bfloat16", help="stored tensors: bfloat16 | float32 | int8 (per-row, half size)"),
    shard_mb: float = typer.Option(15.0, help="model shard size in MiB (0 = one file)"),
    seed: int = typer.Option(0),
    cached_every: int = typer.Option(
        0, help="every k-th step trains the student as the hypic mode serves it (cached segments); 0 = never"
    ),
    cached_segment_lens: str = typer.Option("64,128,256", help="segment lengths drawn for cached steps"),
    cached_seams: str = typer.Option("4,8,16", help="seam widths (tokens) drawn for cached steps"),
    cached_min_suffix: int = typer.Option(128, help="suffix tokens at least, after the cached segments"),
    cached_eval: str = typer.Option("128,8", help="segment length,seam of the cached_kl eval ('0,0' = off)"),
) -> None:
    """Distill the all-attention teacher into a Qwen3.5-style hybrid (GDN + attention, 1-in-4 by default)."""
    from dataclasses import replace

    from hypic_agent.training.convert import ConvertOptions, parse_layer_list
    from hypic_agent.training.data import default_shared_data
    from hypic_agent.training.distill import DistillConfig, run_distill, tiny_config

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    opts: dict = dict(resume=resume, seed=seed, time_budget_s=time_budget, stop_at=stop_at, hidden_weight=hidden_weight)
    if steps is not None:
        opts["steps"] = steps
    opts.update(local_steps=local_steps, train=train, compile=compile, grad_checkpoint=grad_checkpoint)
    opts.update(export_dtype=export_dtype, shard_mb=shard_mb, gdn_chunk=gdn_chunk)
    try:
        layers = parse_layer_list(attention_layers)
        tap = conv_tap if conv_tap and conv_tap > 0 else None
        opts.update(convert=ConvertOptions(conv_tap=tap, seed=seed, attention_layers=layers))
    except HypicError as e:
        err.print(f"[red]error ({e.type}):[/red] {e.message}")
        raise typer.Exit(2) from e
    if process_budget is not None:
        opts["process_budget_s"] = process_budget
    try:
        lens, seams, ev = (
            tuple(int(v) for v in s.split(",") if v.strip()) for s in (cached_segment_lens, cached_seams, cached_eval)
        )
        if len(ev) != 2:
            raise ValueError("--cached-eval is two integers: segment length,seam")
    except ValueError as e:
        err.print(f"[red]error:[/red] --cached-segment-lens / --cached-seams / --cached-eval take integers ({e})")
        raise typer.Exit(2) from e
    opts.update(cached_every=cached_every, cached_segment_lens=lens, cached_seams=seams, cached_eval=ev)
    opts.update(cached_min_suffix=cached_min_suffix)
    if init_from:
        opts["init_from"] = Path(init_from)
    if data:
        opts["data"] = Path(data)
    if shared_data or not tiny:
        opts["shared_data"] = Path(shared_data) if shared_data else default_shared_data()
    try:
        if tiny:
            cfg = tiny_config(Path(out), **opts)
        else:
            cfg = DistillConfig(Path(out), teacher=teacher, batch=batch, seq=seq, device=device, lr=lr, warmup=warmup,
                                gdn=gdn, ckpt_every=ckpt_every, eval_tokens=eval_tokens)  # fmt: skip
            cfg = replace(cfg, **opts)
        run_distill(cfg, log=lambda s: err.print(s, markup=False, highlight=False, soft_wrap=True))
    except HypicError as e:
        err.print(f"[red]error ({e.type}):[/red] {e.message}")
        raise typer.Exit(2) from e


def main() -> None:
    app()


if __name__ == "__main__":
    main()
