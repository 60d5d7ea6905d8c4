"""``hypic-agent``: serve | generate | models | bench."""

from __future__ import annotations

import logging
import sys
import time

import typer
from rich.console import Console

from hypic_agent.config import Settings
from hypic_agent.errors import HypicError
from hypic_agent.runtime.models.cli import models_app

app = typer.Typer(
    help="HYPIC position-independent segment caching for hybrid-attention LLMs.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(models_app, name="models", help="List and fetch models.")
err = Console(stderr=True)


def _settings(model: str | None, device: str | None) -> Settings:
    s = Settings()
    updates = {k: v for k, v in {"model": model, "device": device}.items() if v}
    return s.model_copy(update=updates) if updates else s


@app.command()
def generate(
    prompt: str = typer.Option(..., "--prompt", "-p", help="user message"),
    model: str | None = typer.Option(None, help="model name/path (default: as for the server)"),
    max_tokens: int = typer.Option(64, "--max-tokens"),
    temperature: float = typer.Option(0.0),
    top_p: float = typer.Option(1.0, "--top-p"),
    top_k: int = typer.Option(0, "--top-k"),
    device: str | None = typer.Option(None),
    raw: bool = typer.Option(False, help="no chat template: complete the prompt text as is"),
) -> None:
    """Print a completion of PROMPT (streamed)."""
    from hypic_agent.runtime.loader import load_engine
    from hypic_agent.runtime.results import FinishEvent
    from hypic_agent.runtime.sampling import SamplingParams
    from hypic_agent.segments.tokenize import suffix_ids

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = _settings(model, device)
        with err.status("loading model..."):
            engine = load_engine(settings)
        if raw:
            ids = tuple(engine.tokenizer.encode(prompt, add_special_tokens=True))
        else:
            ids = tuple(suffix_ids(prompt, engine.tokenizer))

        class _Plan:
            segments: tuple = ()
            suffix_ids = ids
            bos_id = None

        params = SamplingParams(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=settings.seed
        )
        t0 = time.perf_counter()
        for ev in engine.generate(_Plan(), params, mode="full_recompute"):
            if isinstance(ev, FinishEvent):
                sys.stdout.write("\n")
                err.print(
                    f"[dim]{ev.completion_tokens} tokens, ttft {ev.ttft_ms:.0f} ms, "
                    f"total {(time.perf_counter() - t0) * 1e3:.0f} ms, finish={ev.finish_reason}[/dim]"
                )
            else:
                sys.stdout.write(ev.text)
                sys.stdout.flush()
    except HypicError as e:
        err.print(f"[red]error ({e.type}):[/red] {e.message}")
        raise typer.Exit(2) from e


@app.command()
def serve(
    host: str | None = typer.Option(None, help="bind address (default 127.0.0.1, or HYPIC_HOST)"),
    port: int | None = typer.Option(None, help="port (default 8000, or HYPIC_PORT)"),
    model: str | None = typer.Option(
        None, help="model name/path (default: the embedded SmolLM2; tiny:<arch> for tests)"
    ),
    device: str | None = typer.Option(None, help="auto | cpu | cuda | cuda:N"),
    prewarm: str | None = typer.Option(None, help="JSON list of segments to register + pre-warm before serving"),
    tenant: str = typer.Option("default", help="tenant that owns the --prewarm segments"),
) -> None:
    """Start the HTTP API server (segment-aware generate, segments store, OpenAI-compatible chat)."""
    from pathlib import Path

    from hypic_agent.api.serve import run_server

    try:
        settings = _settings(model, device)
        updates = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
        run_server(
            settings.model_copy(update=updates) if updates else settings,
            prewarm=Path(prewarm) if prewarm else None,
            tenant=tenant,
        )
    except HypicError as e:
        err.print(f"[red]error ({e.type}):[/red] {e.message}")
        raise typer.Exit(2) from e


def main() -> None:
    app()


if __name__ == "__main__":
    main()
