"""GPU: decode steps replayed from CUDA graphs equal the eager layer loop and the reference decode
(``tests/runtime/reference.py``); the scheduler's batched answers equal each request alone on CUDA."""

from __future__ import annotations

import contextlib

import pytest
import torch

from hypic_agent.config import Settings
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.runtime.results import FinishEvent
from hypic_agent.runtime.runner.decode_graphs import graph_kernels
from hypic_agent.runtime.runner.plan import plan_forward
from hypic_agent.runtime.runner.pool import StatePool
from hypic_agent.runtime.runner.runner import ModelRunner
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.runtime.scheduler.request import GenerationRequest
from hypic_agent.runtime.serving import Serving

from .conftest import make_model, rand_tokens
from .reference import decode_step, prefill

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _model(arch: str, dtype: torch.dtype):
    model, _, _ = make_model(arch)
    return model.to("cuda", dtype)


@pytest.mark.parametrize(
    "arch,dtype,tol", [("qwen3_5_text", torch.float32, 2e-4), ("qwen3_5_moe_text", torch.bfloat16, 3e-2)]
)
def test_graph_decode_equals_eager_and_reference(arch, dtype, tol):
    model = _model(arch, dtype)
    prompts = [rand_tokens(n, 40 + n) for n in (9, 70, 33)]  # batch 3: bucket 4, one padding row
    runs = {}
    for graphs in (True, False):
        pool = StatePool(model.config, slots=4, kv_tokens=1024, page_size=16, device=torch.device("cuda"), dtype=dtype)
        runner = ModelRunner(model, pool, decode_graphs=graphs, max_batch=8)
        seqs = [pool.alloc(120) for _ in prompts]
        out = [runner.forward(plan_forward(pool, seqs, prompts)).clone()]
        for step in range(6):
            toks = [[int(t)] for t in rand_tokens(3, 900 + step)]
            # the eager decode takes the kernels a captured step takes (fused norms): same kernels, same rounding
            with contextlib.nullcontext() if graphs else graph_kernels(model):
                out.append(runner.forward(plan_forward(pool, seqs, toks)).clone())
        runs[graphs] = out
        if graphs:
            assert runner.decode_graphs is not None and runner.decode_graphs.replays == 6, runner.decode_graphs.disabled
    for a, b in zip(runs[True], runs[False], strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    for i, p in enumerate(prompts):  # against the reference forward (torch.cat KV, stacked states)
        st = prefill(model, [p])[0]
        for step in range(6):
            decode_step(model, [st], [rand_tokens(3, 900 + step)[i]])
        torch.testing.assert_close(runs[True][-1][i], st.last_logits.float(), rtol=tol * 5, atol=tol * 5)


class Seg:
    kind = "document"

    def __init__(self, ids: tuple[int, ...]) -> None:
        self.token_ids = ids


def test_scheduler_batched_equals_alone_on_cuda():
    model = _model("qwen3_5_moe_text", torch.float32)
    settings = Settings(
        min_cached_tokens=4, kv_page_size=16, max_running=8, kv_pool_tokens=4096, prefill_chunk_tokens=64
    )
    sampling = SamplingParams(max_tokens=8, ignore_eos=True)

    class P:
        def __init__(self, seed: int) -> None:
            self.segments = [
                type("S", (), {"token_ids": tuple(rand_tokens(30, seed + j)), "kind": "document"})() for j in range(3)
            ]
            self.suffix_ids = rand_tokens(5, seed)
            self.bos_id = None

    plans = [P(100 * i) for i in range(5)]
    for mode in ("hypic", "prefix_cache", "full_recompute"):
        alone = Serving.of(Engine(model, tiny_tokenizer(), "t", settings))
        ref = [next(e for e in alone.generate(p, sampling, mode=mode) if isinstance(e, FinishEvent)) for p in plans]
        alone.close()
        eng = Serving.of(Engine(model, tiny_tokenizer(), "t", settings))
        hs = [eng.scheduler.submit(GenerationRequest(p, sampling, mode)) for p in plans]
        got = [next(e for e in h.events(timeout=120) if isinstance(e, FinishEvent)) for h in hs]
        eng.close()
        assert [r.token_ids for r in ref] == [g.token_ids for g in got], mode
