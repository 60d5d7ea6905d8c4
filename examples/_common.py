"""What every example shares: the SDK import, command-line flags, loud failures, result tables.

Examples import ``hypic_client`` (``pip install ./sdk/python``); from a checkout without it
installed they fall back to ``<repo>/sdk/python`` so ``python examples/quickstart.py`` just works.

Exit codes: 0 success (or a clean SKIP when optional data is absent), 1 an empty answer or a
failed check, 2 the server returned an error or could not be reached / a dependency is missing.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

REPO = Path(__file__).resolve().parents[1]
SDK_DIR = REPO / "sdk" / "python"

try:
    import hypic_client  # noqa: F401
except ImportError:  # a checkout without `pip install ./sdk/python`
    sys.path.insert(0, str(SDK_DIR))

from hypic_client import APIConnectionError, APIStatusError, Hypic, HypicError  # noqa: E402

DEFAULT_URL = "http://127.0.0.1:8000"


@dataclass(frozen=True)
class Budget:
    """Sizes of one run: ``limit`` items, ``max_tokens`` per answer (``--smoke`` shrinks both)."""

    limit: int
    max_tokens: int


class ExampleFailure(Exception):
    """A check of an example failed (empty answer, missing usage...): exit 1 with the message."""


def parser(description: str, *, limit: int | None, max_tokens: int) -> argparse.ArgumentParser:
    """Flags shared by every example; ``limit=None`` leaves ``--limit`` out (fixed-size examples)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--url", default=DEFAULT_URL, help="hypic-agent server root")
    p.add_argument("--api-key", default=None, help="API key (when the server has HYPIC_API_KEYS set)")
    if limit is not None:
        p.add_argument("--limit", type=int, default=limit, help="number of items to run")
    p.add_argument("--max-tokens", type=int, default=max_tokens, help="completion tokens per answer")
    p.add_argument("--mode", default=None, help="reuse method (server default: hypic); e.g. full_recompute")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    p.add_argument(
        "--smoke", action="store_true", help="CI mode: 2-3 items, 6 tokens, short prompts; any non-empty answer passes"
    )
    return p


def budget(args: argparse.Namespace, *, smoke_limit: int = 2, smoke_tokens: int = 6) -> Budget:
    limit = getattr(args, "limit", smoke_limit)
    if args.smoke:
        return Budget(limit=min(limit, smoke_limit), max_tokens=min(args.max_tokens, smoke_tokens))
    return Budget(limit=limit, max_tokens=args.max_tokens)


def client(args: argparse.Namespace) -> Hypic:
    """A client with retries off, so a failing server shows up at once."""
    return Hypic(args.url, api_key=args.api_key, timeout=args.timeout, max_retries=0)


def gen_kwargs(args: argparse.Namespace, max_tokens: int) -> dict[str, Any]:
    """Sampling arguments of ``client.generate``: greedy, the chosen mode."""
    return {"max_tokens": max_tokens, "temperature": 0.0, **({"mode": args.mode} if args.mode else {})}


def require_answer(text: str | None, what: str, *, smoke: bool = False) -> str:
    """The answer, stripped; an empty one is a failure (exit 1).

    With ``smoke`` (CI on the tiny random model, whose answers are noise) any non-empty text passes,
    whitespace included; otherwise the answer must have a visible character.
    """
    raw = text or ""
    answer = raw.strip()
    if not answer and not (smoke and raw):
        raise ExampleFailure(f"empty answer for {what}")
    return answer or raw


def fail(message: str, code: int = 1) -> NoReturn:
    bar = "!" * 72
    print(f"\n{bar}\nFAILED: {message}\n{bar}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def skip(message: str) -> NoReturn:
    print(f"SKIP: {message}", flush=True)
    raise SystemExit(0)


def run(main: Callable[[], None]) -> None:
    """Run ``main``; turn server errors and failed checks into a loud message and a non-zero exit."""
    try:
        main()
    except ExampleFailure as e:
        fail(str(e), 1)
    except APIStatusError as e:
        param = f" (param: {e.param})" if getattr(e, "param", None) else ""
        fail(f"server returned HTTP {e.status_code} {e.error_type}: {e.message}{param}", 2)
    except APIConnectionError as e:
        fail(f"cannot reach the server ({e}); start one with `hypic-agent serve` or pass --url", 2)
    except HypicError as e:
        fail(f"{type(e).__name__}: {e}", 2)


def require_module(module: str, extra: str) -> None:
    """Exit 2 with an install hint when an optional framework is missing."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        fail(f"this example needs {module}: pip install './sdk/python[{extra}]'", 2)


def shorten(value: Any, width: int) -> str:
    """One line of at most ``width`` characters; control characters shown escaped."""
    s = " ".join(str(value).split()) or str(value)
    if not s.isprintable():
        s = s.encode("unicode_escape").decode("ascii")
    return s if len(s) <= width else s[: max(width - 1, 1)] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], widths: Sequence[int] | None = None) -> str:
    """A plain fixed-width table; ``widths`` caps each column (longer cells end in an ellipsis)."""
    caps = list(widths) if widths else [40] * len(headers)
    cells = [[shorten(c, caps[i]) if not isinstance(c, float) else f"{c:.2f}" for i, c in enumerate(r)] for r in rows]
    sizes = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(sizes[i]) for i, h in enumerate(headers))
    out = [line, "  ".join("-" * n for n in sizes)]
    out += ["  ".join(c.rjust(sizes[i]) if _numeric(c) else c.ljust(sizes[i]) for i, c in enumerate(r)) for r in cells]
    return "\n".join(out)


def _numeric(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def banner(title: str, detail: str = "") -> None:
    print(f"== {title} ==")
    if detail:
        print(textwrap.fill(detail, width=100))
