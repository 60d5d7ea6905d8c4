"""One typed settings object for the whole process (env prefix ``HYPIC_``).

Nothing else in the package reads ``os.environ``: code takes a ``Settings`` (or the
values it needs from one) as an argument. ``get_settings()`` builds the process default.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from hypic_agent.config_kernels import KernelSettings

ModeName = Literal["full_recompute", "prefix_cache", "addition", "transition", "transition_rope", "hypic"]
MODES: tuple[str, ...] = ("full_recompute", "prefix_cache", "addition", "transition", "transition_rope", "hypic")


def default_home() -> Path:
    return Path.home() / ".cache" / "hypic-agent"


class Settings(BaseSettings):
    """Process settings. Every field can be set as ``HYPIC_<FIELD>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="HYPIC_", env_nested_delimiter="__", extra="ignore")

    # --- model / runtime -------------------------------------------------------------
    home: Path = Field(default_factory=default_home, description="cache dir: models, store, registry")
    model: str = Field(
        default="smollm2-135m-hybrid",
        description="catalog name (see `hypic-agent models`), local HF folder, .gguf file, or tiny:<arch>",
    )
    device: str = Field(default="auto", description="auto | cpu | cuda | cuda:N")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="weights and activations; auto = bfloat16 on CUDA, float32 on CPU"
    )
    kernel_backend: Literal["auto", "torch", "fla"] = Field(
        default="auto", description="linear-attention and norm kernels: auto (fla on CUDA when installed), torch, fla"
    )
    max_context: int = Field(default=32768, ge=16, description="upper bound on prompt + completion tokens")
    cuda_graphs: bool = Field(
        default=True, description="replay short forwards' feed-forward blocks from CUDA graphs (CUDA only)"
    )
    combine_graph_after: int = Field(
        default=2,
        ge=0,
        description="replay a whole combine forward from a CUDA graph once its layout (segment lengths, "
        "seams, question length) has been seen this many times; 0 = never (CUDA only, with cuda_graphs)",
    )
    combine_graphs_max: int = Field(default=4, ge=1, description="combine layouts kept as CUDA graphs (LRU)")
    cold_graph_after: int = Field(
        default=2,
        ge=0,
        description="replay the linear layers' cold-segment core (conv + delta rule + pairs) from CUDA graphs "
        "once a cold batch of the same lengths and seams has been seen this many times; 0 = never (CUDA only, "
        "with cuda_graphs)",
    )
    cold_graphs_max: int = Field(
        default=2,
        ge=1,
        description="cold-batch layouts kept as CUDA graphs (LRU; ~4.7 GB each at 4 x 1k tokens of "
        "the Qwen3.5-35B-A3B shape)",
    )
    seed: int = Field(
        default=0, description="seed of random weights (tiny:<arch>, random:<config>) and of --raw sampling"
    )
    kernels: KernelSettings = Field(
        default_factory=KernelSettings, description="kernel choices (HYPIC_KERNELS__<FIELD>; see KernelSettings)"
    )

    # --- serving core (scheduler, state pool, runner) ----------------------------------
    max_running: int = Field(default=64, ge=1, description="requests decoding at once (= linear-state slots)")
    max_waiting: int = Field(default=1024, ge=1, description="queued requests; more are answered 429")
    overlap_schedule: bool = Field(
        default=True,
        description="launch a decode step before the previous step's tokens are read on the host (its input ids "
        "come from the device-side sample; stop checks and streaming run one step behind, while the device works)",
    )
    prefill_chunk_tokens: int = Field(
        default=8192, ge=16, description="prepare tokens (prefill chunks, cold builds) per scheduler step"
    )
    prefill_idle_chunk_tokens: int = Field(
        default=32768,
        ge=0,
        description="prefill tokens a step may take when no request is decoding and no HYPIC work joins it "
        "(nobody waits behind a long step): a lone prompt up to this size is one forward, not "
        "prefill_chunk_tokens-sized pieces; 0 = prefill_chunk_tokens",
    )
    kv_page_size: int = Field(default=64, ge=1, description="token rows per attention KV page")
    kv_pool_tokens: int = Field(
        default=0, ge=0, description="attention KV rows in the pool; 0 = auto (CUDA: kv_pool_fraction of free memory)"
    )
    kv_pool_fraction: float = Field(default=0.3, gt=0, le=0.9, description="share of free GPU memory for the pool")
    decode_graph_max_batch: int = Field(
        default=128, ge=1, description="largest decode batch replayed from CUDA graphs (CUDA, with cuda_graphs)"
    )
    warm_start: bool | Literal["auto"] = Field(
        default="auto",
        description="serve: auto = on for a CUDA device, off on the CPU (nothing compiles or is captured there); "
        "on: before listening, run a decode step at every decode batch bucket, prefills of "
        "warm_start_prefill_tokens and composed requests over warm_start_segments (a logged start-up stage), so "
        "the first requests pay no Triton compile, autotune or decode / layer-graph capture (a combine layout's "
        "graph is still captured on its combine_graph_after-th sighting); nothing is stored. Triton's kernels "
        "and autotune results are kept in <home>/triton (TRITON_CACHE_DIR, TRITON_CACHE_AUTOTUNING unless set) "
        "whatever this is, so a second start neither compiles nor autotunes again (CUDA graphs are captured anew)",
    )
    warm_start_prefill_tokens: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=list,
        description="warm_start: prompt sizes prefilled (each capped at prefill_chunk_tokens); empty = auto: on "
        "CUDA every layer-graph token bucket, each also less 3 tokens, and prefill_chunk_tokens; on CPU 64",
    )
    warm_start_segments: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: [64, 64, 40],
        description="warm_start: segment lengths of the composed (hypic) requests, run once cold and once "
        "cached with a 16-token question (the first two also as a prefix_cache pair); those that fit one request",
    )
    prefix_snapshots: int = Field(
        default=32,
        ge=0,
        description="prefix_cache mode: cached prefixes that keep their linear state (one snapshot of a slot each, "
        "in the state pool; their attention KV is shared pool pages); 0 = the mode caches nothing",
    )

    # --- HYPIC -----------------------------------------------------------------------
    default_mode: ModeName = Field(default="hypic", description="mode of a request that names none")
    default_seam: float = Field(
        default=8,
        ge=0,
        description="seam of a request that names none: tokens recomputed at each cached segment's start (a count "
        "> 1), a fraction of the segment in (0, 1], or 0",
    )
    seam_budget: float = Field(
        default=0.03,
        ge=0,
        le=1,
        description='seam="auto": the share of the cached segments\' tokens recomputed in context, spread over a '
        "request's segments by their measured deviation (1 = full_recompute)",
    )
    pair_dtype: Literal["float32", "bfloat16"] = Field(
        default="float32", description="dtype of the linear layers' stored transition pairs"
    )
    build_prefix: Literal["none", "bos", "template", "document"] = Field(
        default="none",
        description="what cold segments are prefilled after (runtime.hypic.build_context): nothing (isolated), the "
        "BOS token, the chat template's system header, or a system turn (build_system_prompt) and a neutral "
        "document; its rows are dropped from the entry and its tokens are part of every entry key",
    )
    build_system_prompt: str = Field(
        default="",
        max_length=4000,
        description="build_prefix='document': the system message of the build context (set it to the application's "
        "system prompt)",
    )
    min_cached_tokens: int = Field(default=16, ge=0, description="shorter segments are recomputed, never cached")
    scatter_workers: int = Field(
        default=1,
        ge=1,
        description="worker processes that build cold segments (torch.distributed: gloo on CPU, NCCL on "
        "CUDA); 1 = in process, on rank 0's model",
    )
    scatter_devices: list[str] = Field(
        default_factory=list,
        description="one device per scatter worker (empty: the CPU on CPU; on CUDA every GPU but rank 0's)",
    )
    scatter_policy: Literal["lpt", "round_robin"] = Field(
        default="lpt", description="how cold segments are spread over scatter workers"
    )
    scatter_timeout_s: float = Field(
        default=120.0, gt=0, description="a scatter worker that does not answer within this is replaced"
    )
    scatter_stream_layers: int = Field(
        default=4,
        ge=0,
        description="a scatter worker sends its entries back this many layers at a time, each group as soon as "
        "the batch's layers of it are built (transfer overlaps the build); 0 = whole entries after the build",
    )
    split_segment_tokens: int = Field(
        default=0,
        ge=0,
        description="composed modes: a segment longer than this is cut into pieces of this many tokens (from its "
        "start), each cached, built (in parallel on scatter workers) and seamed as a segment of its own; 0 = off",
    )
    fuse_cold_builds: bool = Field(
        default=True,
        description="with one scatter worker, build a request's cold segments inside its combine forward "
        "(their token-local stages shared with the active tokens) instead of in a separate pass",
    )

    # --- store -----------------------------------------------------------------------
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; default sqlite file in home")
    store_dir: Path | None = Field(default=None, description="disk tier folder; default <home>/store")
    gpu_budget_bytes: int = Field(default=8 << 30, ge=0, description="bytes of entries the GPU tier keeps (CUDA only)")
    cuda_headroom_bytes: int = Field(
        default=2 << 30,
        ge=0,
        description="free block kept in the CUDA caching allocator, refilled while a request's forward runs, "
        "so the next request's new entries never wait on cudaMalloc before its first kernel; 0 = off",
    )
    cpu_budget_bytes: int = Field(default=4 << 30, ge=0, description="bytes of entries the CPU memory tier keeps")
    disk_budget_bytes: int = Field(default=64 << 30, ge=0, description="bytes of entries the disk tier keeps")
    default_ttl_s: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="seconds a stored segment lives unless it sets its own ttl; unset: no expiry",
    )
    hit_flush_interval_s: float = Field(
        default=2.0,
        ge=0,
        allow_inf_nan=False,
        description="hit counts / last-used times are written to the registry at most this long after a hit "
        "(0 = at every hit); the API writes a request's hits as soon as it has answered it",
    )
    tenant_share: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="each tenant's share of every tier's budget: its pinned bytes may not exceed it (PUT / PATCH "
        "over it: 409, or 413 for one entry larger than it), and other tenants' entries never evict it below it "
        "(scaled down when the known tenants' shares add up to more than 1); default 1 / the number of tenants "
        "in api_keys (1 without keys)",
    )
    tenant_shares: dict[str, Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=dict, description="tenant -> share, overriding tenant_share for that tenant"
    )

    # --- API -------------------------------------------------------------------------
    host: str = Field(default="127.0.0.1", description="address serve listens on (0.0.0.0: every interface)")
    port: int = Field(default=8000, description="port serve listens on")
    engine_process: bool | Literal["auto"] = Field(
        default="auto",
        description="run the engine core (model, state pool, scheduler, segment store) in its own process and the "
        "HTTP API (tokenization, SSE) in this one, talking over a pipe (runtime/core_process): a crash of the "
        "engine fails its requests with 503 engine_dead and /health says so, instead of a hang; auto = on for "
        "`hypic-agent serve`, off for an app built in-process (create_app, `generate` without --url, the tests)",
    )
    switch_interval_ms: float | None = Field(
        default=None,
        gt=0,
        description="the interpreter's thread switch interval while the server runs: the API's event loop waits up "
        "to this long for the GIL behind the busy engine thread; None keeps Python's (5 ms)",
    )
    api_keys: dict[str, str] = Field(default_factory=dict, description="api key -> tenant; empty = no auth")
    auth_failures_per_minute: int = Field(
        default=20,
        ge=0,
        description="wrong API keys (or metrics tokens) one client address may send per minute that start with the "
        "same auth_key_prefix_chars characters; past it that address's wrong keys with that prefix get 429 until "
        "the minute has passed (a valid key always authenticates); 0 = unlimited",
    )
    auth_address_failures_per_minute: int = Field(
        default=100,
        ge=0,
        description="wrong API keys one client address may send per minute whatever their prefix; past it every "
        "wrong key from that address gets 429 (valid keys still authenticate); 0 = unlimited",
    )
    auth_key_prefix_chars: int = Field(
        default=8,
        ge=1,
        description="leading characters of a presented key that identify it for auth_failures_per_minute",
    )
    metrics_token: str | None = Field(
        default=None,
        description="bearer token GET /metrics requires (401 without it); unset: /metrics is open without "
        "api_keys and closed (401) with them unless metrics_open is set",
    )
    metrics_open: bool = Field(
        default=False,
        description="with api_keys on and no metrics_token: serve GET /metrics to any client without a key "
        "(for a scraper on a trusted network); default closed (401)",
    )
    metrics_tenant_labels: bool = Field(
        default=False, description="label per-tenant metrics (rate-limit refusals) with tenant names"
    )
    max_segments: int = Field(default=256, ge=1, description="segments in one request, at most (more: 400)")
    max_body_bytes: int = Field(default=8 << 20, ge=1024, description="bytes of a request body, at most (more: 413)")
    max_inflight_body_bytes: int = Field(
        default=256 << 20,
        ge=0,
        description="request body bytes the server holds at once (being read, or of requests not yet answered); "
        "a request that would go over it gets 503 with Retry-After (one request is always let in); 0 = unlimited",
    )
    header_timeout_s: float = Field(
        default=30.0,
        gt=0,
        allow_inf_nan=False,
        description="a connection must finish sending a request's headers within this many seconds of opening "
        "(or of its previous response); else it is answered 408 (if it sent anything) and closed",
    )
    body_timeout_s: float = Field(
        default=120.0,
        gt=0,
        allow_inf_nan=False,
        description="a request's body must arrive within this many seconds of its headers; else 408 and the "
        "connection is closed",
    )
    max_connections: int = Field(
        default=2048,
        ge=0,
        description="open HTTP connections at most; one more is answered 503 and closed at once; 0 = unlimited",
    )
    max_request_store_bytes: int | None = Field(
        default=None,
        ge=0,
        description="estimated entry bytes one request may add to the segment store (PUT /v1/segments, or a "
        "prompt's new segments), from each new segment's tokens and the model's entry sizes, checked before "
        "anything is built (413 over it); None = auto: a full context window cut into 32 segments, at least "
        "1 GiB; 0 = unlimited",
    )
    tenant_store_bytes_per_minute: int | None = Field(
        default=None,
        ge=0,
        description="estimated entry bytes one tenant's requests may add to the store in any 60 s (429 with "
        "Retry-After over it); None = auto: 4 x the auto max_request_store_bytes; 0 = unlimited",
    )
    max_tokens_limit: int = Field(
        default=4096, ge=1, description="max_tokens a request may ask for, at most (more: 400)"
    )
    model_aliases: list[str] = Field(
        default_factory=list,
        description="more names the served model answers to in a request's `model` (any other name: 404)",
    )
    grammar_cache_size: int = Field(
        default=256, ge=1, description="compiled grammars kept (response_format schemas, forced tool calls)"
    )
    grammar_max_string_length: int = Field(
        default=2048,
        ge=0,
        description="characters of a JSON string a response_format schema leaves unbounded (no maxLength, "
        "pattern, format, enum): the grammar ends it there, so a model cannot loop inside it (bounded strings "
        "are written without escapes: no quote, backslash or line break); 0 = unbounded",
    )
    grammar_max_tool_string_length: int = Field(
        default=0,
        ge=0,
        description="the same bound for the strings of a forced tool call's arguments that the tool's schema "
        "leaves unbounded; 0 (default) = unbounded, so arguments keep escapes (a file's lines, quotes); a "
        "bound ends a model looping inside a string but admits no quote, backslash or line break",
    )
    grammar_max_number_digits: int = Field(
        default=15,
        ge=0,
        description="digits before the point of a JSON integer or number a schema leaves unbounded (no "
        "minimum / maximum): the grammar's range is +-(10^digits - 1), numbers get at most 6 decimals and no "
        "exponent; 0 = unbounded",
    )
    grammar_max_array_items: int = Field(
        default=1024, ge=0, description="items of a JSON array a schema leaves unbounded (no maxItems); 0 = unbounded"
    )
    max_parallel_tool_calls: int = Field(
        default=8,
        ge=1,
        description="calls one answer may hold under tool_choice 'required' with parallel_tool_calls (the "
        "grammar ends after that many; decoding also ends when the model repeats a call it already made)",
    )
    text_chars_per_token: int = Field(
        default=32,
        ge=1,
        description="a prompt (or a PUT segment) with more characters than max_context x this is refused "
        "before it is tokenized (it could not fit however it tokenizes)",
    )
    max_metadata_bytes: int = Field(default=16 << 10, ge=0, description="a segment's metadata as JSON, at most")
    max_metadata_depth: int = Field(default=8, ge=1, description="nesting levels of a segment's metadata, at most")
    max_schema_depth: int = Field(
        default=32,
        ge=1,
        description="JSON nesting levels of a tool's parameters or a response_format schema, at most (a grammar "
        "is compiled from them: 400 schema levels took 8 s)",
    )
    tenant_requests_per_minute: int = Field(default=0, ge=0, description="0 = unlimited")
    log_level: str = Field(default="INFO", description="DEBUG | INFO | WARNING | ERROR (JSON log lines on stderr)")

    def resolved_store_dir(self) -> Path:
        return self.store_dir or (self.home / "store")

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'registry.sqlite3'}"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
