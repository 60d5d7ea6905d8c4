"""Combine: one forward over the active tokens only (seam windows + suffix) on top of cached entries.

Linear layers: the running state advances piece -> cached body pair -> next piece; each piece's
conv state is preloaded with the tail of the body before it. Two ways to run it, same result:

* fused (``kernels.combine_scan``, default on CUDA when the active tokens are few): one launch per
  layer walks the chain, token steps through pieces and ``T @ h + S`` over bodies, reading the
  cached pairs through a pointer table built once per request. The bodies at the head of a
  ``w = 0`` prompt are composed for all layers before the forward, in one launch
  (``chain.compose_body_pointers``), and each layer's scan starts from that state;
* chunked: each piece's own pair (from a zero state) comes out of one varlen pass, one
  ``chain_scan`` gives the state entering every piece, and the pieces' outputs follow from those
  states with the same WY factors (``GatedDeltaNet.mix_after_pairs``).

(Both live in ``combine_linear``.)

Attention layers: active tokens attend over spliced KV (cached bodies rotated to their global
positions, or left at their local positions without ``rerotate``) and write fresh KV for the
active rows. A linear mixer with RoPE inside (Ring-linear's ``lightning_rope``) gets the same
treatment of its cached states: ``place(S, P)`` = ``R(P) S`` for a body whose segment starts at P.
Feed-forward blocks replay from CUDA graphs where enabled (``runner.stage_graphs``).

Served through the scheduler, the combine writes its result straight into the request's slot and
pages of the state pool (``into``: ``runner.destination.StateDestination``): each attention layer
assembles its K/V in the pool's rows (a contiguous run of pages), each linear layer's final state
is copied into the slot; no standalone state of the whole prompt is built and then loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from hypic_agent.kernels.config import DEFAULT_KERNELS, KernelConfig
from hypic_agent.runtime.hypic.build import ColdBatch
from hypic_agent.runtime.hypic.combine_inputs import CombineInputs, combine_inputs
from hypic_agent.runtime.hypic.combine_work import CombineWork
from hypic_agent.runtime.hypic.entry import SegmentEntry
from hypic_agent.runtime.hypic.layout import CombineLayout
from hypic_agent.runtime.hypic.modes import ModeSpec
from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.runner.destination import StateDestination
from hypic_agent.runtime.runner.graph_set import GraphSet
from hypic_agent.runtime.runner.layer_loop import layer_steps
from hypic_agent.runtime.runner.plan import plan_forward
from hypic_agent.runtime.runner.stage_graphs import LayerGraphs
from hypic_agent.runtime.state import RequestState


def _graphable(model: HybridForCausalLM, lay: CombineLayout, kinds: set[str]) -> bool:
    """Whether a whole-forward graph can run this combine: nothing in it may read a device value on the
    host. GDN's fused scan and the short convolutions read none; KDA and the decay-only kinds only on
    fla's fused recurrent kernels (``recurrent_scan_max_tokens`` covers the active tokens: their chunked
    kernels read ``cu_seqlens`` on the host), and blend rows run eagerly."""
    if kinds <= {"gdn", "short_conv"}:
        return True
    return lay.blend_rows is None and lay.active_ids.numel() <= model.kernels.recurrent_scan_max_tokens


@torch.no_grad()
def combine(
    model: HybridForCausalLM,
    lay: CombineLayout,
    entries: list[SegmentEntry | None],
    spec: ModeSpec,
    *,
    fused_scan: bool | None = None,
    cold: ColdBatch | None = None,
    kernels: KernelConfig = DEFAULT_KERNELS,
    into: StateDestination | None = None,
    graphs: GraphSet | None = None,
) -> RequestState:
    """Build the request's working state from entries + active tokens; sets ``last_logits``.

    ``into``: write the state into the request's slot and pages of the state pool as the forward
    runs (``runner.destination``); the state returned then has no layers (length, logits, tokens).

    ``fused_scan``: run linear layers through the fused combine scan (True), the chunked path
    (False) or pick (None: fused on CUDA for few active tokens). ``kernels``: the kernel choices the
    forward is planned and run with (``combine_inputs``; the combine graphs are kept per choice).
    The model's own modules (MoE, norms) read theirs (``HybridForCausalLM.set_kernels``).

    ``cold``: segments without an entry yet, built in the same forward. Their entries (``cold.entries``,
    already placed in ``entries``) are filled layer by layer before the active tokens read them, and
    both token sets share every token-local stage (one ``mixer_in`` / ``mixer_out`` over the cold rows
    followed by the active rows: one read of the expert weights per layer instead of two).

    Without ``cold``, a layout seen before may replay from a CUDA graph of the whole forward
    (``combine_graphs``; enabled with the layer graphs)."""
    kinds = {layer.mixer_kind for layer in model.layers} - {"attention"}
    stage = not kinds <= {"gdn"}  # the chunked path reads the pairs from the entries (combine_staging)
    whole = graphs.combines if graphs is not None and cold is None and _graphable(model, lay, kinds) else None
    stages = graphs.stages if graphs is not None else None
    if lay.blend_rows is not None and any(layer.linear_attn is not None for layer in model.layers):
        fused_scan = False  # blend rows of a hybrid run on the chunked path, eagerly (blend_rows)
    if into is not None and into.length != lay.total:
        raise ValueError(f"a combine of {lay.total} tokens into a destination of {into.length}")
    building = cold.entries if cold is not None else ()
    if whole is not None:
        state = whole.replay(lay, entries, spec, fused_scan, kernels, into)
        if state is not None:
            return state
    if cold is not None:  # planned once the GPU has the first layer's work (see forward_steps)
        *_, state = forward_steps(
            model, lay, entries, spec,
            lambda: combine_inputs(model, lay, entries, spec.transition, fused_scan, building, kernels=kernels), cold,
            into=into, stages=stages,
        )  # fmt: skip
        assert isinstance(state, RequestState)
        return state
    inputs = combine_inputs(model, lay, entries, spec.transition, fused_scan, building, kernels=kernels)
    if whole is not None and whole.should_capture(lay, spec, fused_scan, kernels):
        state = whole.capture(lay, entries, spec, fused_scan, kernels, inputs, forward_steps, into, stage)
        if state is not None:
            return state
    *_, state = forward_steps(model, lay, entries, spec, inputs, cold, into=into, stages=stages)
    assert isinstance(state, RequestState)
    return state


def forward_steps(
    model: HybridForCausalLM,
    lay: CombineLayout,
    entries: list[SegmentEntry | None],
    spec: ModeSpec,
    inputs: CombineInputs | Callable[[], CombineInputs],
    cold: ColdBatch | None = None,
    every: int = 0,
    into: StateDestination | None = None,
    stages: LayerGraphs | None = None,
) -> Iterator[RequestState | None]:
    """The combine forward on planned ``inputs`` (``combine_inputs``), as one ``CombineWork`` (and the
    cold batch) through the runner's layer loop, in steps: yields None after every ``every`` layers
    (0: never), then the request's state (``into``: written layer by layer into the pool, the state
    yielded has no layers). With ``inputs.by_pointer()`` it reads no entry tensor directly: every
    cached tensor comes through a pointer table, which is what lets ``combine_graphs`` capture it
    (as a few graphs, one per step: the GPU starts on the first while the host launches the rest).

    ``inputs`` may be a function that plans them: it is called once the first layer's token-local
    work and cold core are queued (``CombineWork.plan``)."""
    work = CombineWork(lay, entries, spec, inputs, into)
    colds = (cold,) if cold is not None else ()
    plan = plan_forward(None, [], [], combines=(work,), colds=colds, device=lay.active_ids.device)
    for out in layer_steps(model, plan, None, every=every, stages=stages):
        yield None if out is None else work.state(out[0])
