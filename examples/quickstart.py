"""Quickstart: three calls over the same three documents; the server caches each one on its own.

Call 1 sees the documents for the first time (cold). Call 2 sends them in a new order and call 3
in yet another order with a new question (streamed): each document is a cache hit wherever it
sits, so TTFT drops and ``cached_tokens`` covers the documents. ``ttft_ms`` is the server's time
to first token; ``first_chunk_ms`` (streamed call) and ``wall_ms`` are measured by the client.

    hypic-agent serve                      # other terminal: the default model (smollm2-135m-hybrid) on :8000
    python examples/quickstart.py
"""

from __future__ import annotations

import time

from _common import ExampleFailure, banner, client, gen_kwargs, parser, require_answer, run, table
from hypic_client import GenerateResponse, doc, system

DOCS = {
    "Nile": doc(
        "The Nile is a major north-flowing river in northeastern Africa. It flows into the Mediterranean Sea "
        "and is about 6,650 kilometres long. Its water has sustained Egyptian civilisation for millennia.",
        title="Nile",
    ),
    "Amazon": doc(
        "The Amazon River in South America is the largest river by discharge volume of water in the world. "
        "It rises in the Andes mountains of Peru and flows east across Brazil into the Atlantic Ocean.",
        title="Amazon",
    ),
    "Yangtze": doc(
        "The Yangtze is the longest river in Asia and the third-longest in the world. It flows for about "
        "6,300 kilometres from the Tibetan Plateau to the East China Sea at Shanghai.",
        title="Yangtze",
    ),
}
SYSTEM = system("You answer questions from the documents. Answer in one short sentence.")
CALLS = [
    (["Nile", "Amazon", "Yangtze"], "Into which sea does the Nile flow?", False),
    (["Yangtze", "Nile", "Amazon"], "Into which sea does the Nile flow?", False),
    (["Amazon", "Yangtze", "Nile"], "Which river is the longest in Asia?", True),
]
NO_REUSE_MODES = ("full_recompute", "prefix_cache")


def main() -> None:
    args = parser(__doc__.splitlines()[0], limit=None, max_tokens=48).parse_args()
    max_tokens = min(args.max_tokens, 6) if args.smoke else args.max_tokens
    rows = []
    with client(args) as hypic:
        banner("quickstart", f"server {args.url}: {hypic.health().model_dump().get('model', '?')}")
        for n, (order, question, stream) in enumerate(CALLS, 1):
            segments = [SYSTEM, *(DOCS[name] for name in order)]
            t0 = time.perf_counter()
            first_ms = None
            if stream:
                with hypic.generate(segments, question, stream=True, **gen_kwargs(args, max_tokens)) as chunks:
                    for chunk in chunks:
                        if chunk.text and first_ms is None:
                            first_ms = (time.perf_counter() - t0) * 1e3
                resp: GenerateResponse = chunks.final_response()
            else:
                resp = hypic.generate(segments, question, **gen_kwargs(args, max_tokens))
            wall_ms = (time.perf_counter() - t0) * 1e3
            answer = require_answer(resp.text, f"call {n}", smoke=args.smoke)
            u = resp.usage
            hits = sum(s.hit for s in u.segments)
            if n > 1 and args.mode not in NO_REUSE_MODES and u.cached_tokens == 0:
                raise ExampleFailure(f"call {n} reused the documents but the server reported 0 cached tokens")
            rows.append(
                [
                    n,
                    " > ".join(order),
                    "yes" if stream else "no",
                    f"{resp.timings.ttft_ms or 0:.0f}",
                    f"{first_ms:.0f}" if first_ms is not None else "-",
                    f"{wall_ms:.0f}",
                    u.cached_tokens,
                    u.recomputed_tokens,
                    f"{hits}/{len(u.segments)}",
                    answer,
                ]
            )
    headers = ["call", "document order", "stream", "ttft_ms", "first_chunk_ms", "wall_ms", "cached", "recomputed"]
    print(table([*headers, "hits", "answer"], rows, [4, 26, 6, 8, 14, 8, 7, 10, 5, 56]))
    ttfts = " -> ".join(f"{r[3]} ms" for r in rows)
    print(f"OK quickstart: 3 calls, ttft {ttfts}, cached tokens {', '.join(str(r[6]) for r in rows)}")


if __name__ == "__main__":
    run(main)
