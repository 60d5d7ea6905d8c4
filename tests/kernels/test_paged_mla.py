"""Paged MLA decode (absorbed form): the torch twin against the generic paged-attention twin with the
key ``[latent | rope]`` and the value ``latent`` (one kv head), NaN in every slot a sequence does not
own, and (through Triton's CPU interpreter, in a subprocess) the Triton kernel against the twin. The
model-level check (absorbed decode = expanded attention) is in ``tests/runtime/test_mla_latent.py``."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.kernels.paged_attention import paged_decode_attention_torch
from hypic_agent.kernels.paged_mla import paged_mla_decode, paged_mla_decode_torch
from tests.kernels.helpers import rel_err, run_in_interpreter
from tests.kernels.test_paged_attention import paged_inputs


def mla_inputs(lens: list[int], H: int, R: int, E: int, page: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """The dispatcher's tensors: pages of one kv head with key ``[R + E]`` split into the latent
    (also the value) and the rope part; unowned slots NaN, block-table entries past a sequence's
    pages out of range."""
    x, _, _ = paged_inputs(lens, H, 1, R + E, 1, page, seed=seed)
    k = x["k_cache"]
    return {
        "q_lat": x["q"][..., :R],
        "q_rope": x["q"][..., R:],
        "lat_cache": k[..., :R].contiguous(),
        "rope_cache": k[..., R:].contiguous(),
        "block_table": x["block_table"],
        "context_lens": x["context_lens"],
    }


def generic_reference(x: dict[str, torch.Tensor], scale: float) -> torch.Tensor:
    """The same attention through the generic paged twin: key ``[latent | rope]``, value ``latent``."""
    return paged_decode_attention_torch(
        torch.cat([x["q_lat"], x["q_rope"]], -1),
        torch.cat([x["lat_cache"], x["rope_cache"]], -1),
        x["lat_cache"],
        x["block_table"],
        x["context_lens"],
        scale,
    )


@pytest.mark.parametrize("lens,H,R,E,page", [([5, 0, 33, 16], 4, 24, 8, 8), ([70], 3, 64, 16, 16)])
def test_twin_equals_generic_paged_attention(lens, H, R, E, page):
    x = mla_inputs(lens, H, R, E, page, seed=len(lens))
    got = paged_mla_decode(**x, scale=0.2)
    ref = generic_reference(x, 0.2)
    assert got.dtype == torch.float32 and not got.isnan().any()  # NaN in unowned slots never leaks
    for i, L in enumerate(lens):
        if L == 0:
            assert torch.equal(got[i], torch.zeros_like(got[i]))
        else:
            assert rel_err(got[i], ref[i]) < 1e-6, (i, L)


def test_twin_is_attention_over_the_context_only():
    """Changing a key past a sequence's length (inside its last page) changes nothing; changing one
    inside does."""
    x = mla_inputs([10], 2, 16, 8, 8, seed=5)
    base = paged_mla_decode_torch(**x, scale=0.5)
    page = int(x["block_table"][0, 1])
    x["lat_cache"][page, 3] = 7.0  # key 11: past the 10 keys
    assert torch.equal(paged_mla_decode_torch(**x, scale=0.5), base)
    x["lat_cache"][page, 1] = 7.0  # key 9: the last one
    assert rel_err(paged_mla_decode_torch(**x, scale=0.5), base) > 1e-2


def test_dispatcher_rejects_bad_arguments():
    x = mla_inputs([4], 2, 16, 8, 8)
    two_heads = {name: x[name].expand(-1, -1, 2, -1) for name in ("lat_cache", "rope_cache")}
    with pytest.raises(ValueError, match="one kv head"):
        paged_mla_decode(**{**x, **two_heads}, scale=1.0)
    with pytest.raises(ValueError, match="disagree"):
        paged_mla_decode(**{**x, "q_lat": x["q_lat"][..., :8]}, scale=1.0)
    with pytest.raises(ValueError, match="needs CUDA"):
        paged_mla_decode(**x, scale=1.0, backend="fla")


INTERPRETER = """
import torch
from unittest import mock
import hypic_agent.kernels.paged_mla as pm
from hypic_agent.kernels.paged_mla import paged_mla_decode_torch
from hypic_agent.kernels.paged_mla.paged_mla_triton import paged_mla_decode_triton
from tests.kernels.helpers import rel_err
from tests.kernels.test_paged_mla import mla_inputs

def check(o, ref, lens, what):
    assert o.shape == ref.shape and not o.isnan().any(), what
    for i, L in enumerate(lens):
        if L == 0:
            assert torch.equal(o[i], torch.zeros_like(o[i])), (what, i)
        else:
            assert rel_err(o[i].float(), ref[i]) < 1e-5, (what, i, L, rel_err(o[i].float(), ref[i]))

# 20 heads (a full and a partial 16-head block), R 40 / E 8 (padded to 64 / 16), 8-key pages; tiles
# smaller and larger than a page; one split, several, more splits than tiles
lens = [0, 1, 9, 16, 45]
x = mla_inputs(lens, 20, 40, 8, 8, seed=1)
ref = paged_mla_decode_torch(**x, scale=0.3)
for ns in (1, 3, 8):
    for bn in (4, 16):
        check(paged_mla_decode_triton(**x, scale=0.3, num_splits=ns, block=(16, bn, 2)), ref, lens, (ns, bn))
# through the dispatcher (Triton branch forced): default splits and tile, int64 lengths
lens = [30, 0]
x = mla_inputs(lens, 4, 32, 16, 4, seed=2)
x["context_lens"] = x["context_lens"].long()
ref = paged_mla_decode_torch(**x, scale=0.25)
with mock.patch.object(pm, "resolve_triton", lambda b, d: True):
    check(pm.paged_mla_decode(**x, scale=0.25), ref, lens, "dispatcher")
"""


def test_triton_kernel_matches_twin_in_interpreter():
    run_in_interpreter("paged_mla_decode", INTERPRETER)
