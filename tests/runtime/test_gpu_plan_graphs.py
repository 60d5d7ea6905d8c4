"""GPU: each plan kind the runner replays from a CUDA graph (a decode bucket, a lone combine's layout, a
cold batch's linear core, the layer stages' token buckets) gives, through the scheduler, the tokens and
logprobs of the same requests run eagerly (``Settings.cuda_graphs`` off)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hypic_agent.config import Settings
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.runtime.results import FinishEvent
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.runtime.serving import Serving

from .conftest import make_model, rand_tokens

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


class Seg:
    kind = "document"

    def __init__(self, ids: tuple[int, ...]) -> None:
        self.token_ids = ids


class Plan:
    def __init__(self, segs: list[Seg], suffix: list[int]) -> None:
        self.segments, self.suffix_ids, self.bos_id = segs, suffix, None


def _plans() -> list[Plan]:
    """Three requests of three cold documents each (one cold-batch layout), then the same documents in
    other orders (warm: lone combines of one layout); every suffix 6 tokens."""
    docs = [Seg(tuple(rand_tokens(40, 300 + i))) for i in range(9)]
    cold = [docs[3 * j : 3 * j + 3] for j in range(3)]
    warm = [[g[1], g[2], g[0]] for g in cold]
    return [Plan(segs, rand_tokens(6, 70 + i)) for i, segs in enumerate(cold + warm)]


def _serve(model: Any, graphs: bool, plans: list[Plan]) -> tuple[list[FinishEvent], dict[str, int]]:
    settings = Settings(
        min_cached_tokens=4,
        kv_page_size=16,
        max_running=4,
        kv_pool_tokens=2048,
        prefill_chunk_tokens=64,
        cuda_graphs=graphs,
        combine_graph_after=1,
        cold_graph_after=1,
        warm_start=False,
    )
    serving = Serving.of(Engine(model, tiny_tokenizer(), "t", settings))
    sampling = SamplingParams(max_tokens=6, ignore_eos=True, logprobs=True)
    try:
        out = [
            next(e for e in serving.generate(p, sampling, mode="hypic") if isinstance(e, FinishEvent)) for p in plans
        ]
        g, dg = serving.engine.runner.graphs, serving.runner.decode_graphs
        replays = {
            "decode": dg.replays if dg is not None else 0,
            "combine": g.combines.replays if g.combines is not None else 0,
            "cold": g.colds.replays if g.colds is not None else 0,
        }
    finally:
        serving.close()
    return out, replays


def test_every_captured_plan_kind_equals_eager_through_the_scheduler():
    # the dense tiny model: in fp32 the MoE runs its sorted-by-expert torch path, which reads expert counts
    # on the host and cannot be captured (the Triton MoE is bf16 / fp16 only)
    model, _, _ = make_model("qwen3_5_text")
    model = model.to("cuda", torch.float32)
    plans = _plans()
    eager, none = _serve(model, False, plans)
    graphed, replays = _serve(model, True, plans)
    assert none == {"decode": 0, "combine": 0, "cold": 0}
    # decode steps of batch 1; the 2nd and 3rd warm requests' combines; the 2nd and 3rd cold batches' cores
    assert replays["decode"] > 0 and replays["combine"] >= 1 and replays["cold"] >= 1, replays
    for a, b in zip(eager, graphed, strict=True):
        assert a.token_ids == b.token_ids
        assert a.prepared.cached_tokens == b.prepared.cached_tokens
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=1e-3, atol=1e-3)
    cached = [e.prepared.cached_tokens for e in eager]
    assert cached[:3] == [0, 0, 0] and min(cached[3:]) > 0, cached  # the reordered requests are warm
