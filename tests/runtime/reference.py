"""The plain reference forward the runtime is tested against (the twin of ``runner.layer_loop``).

Written straight over ``RequestState``s, with no state pool, no plan and no graphs: prefill packs N
independent sequences into one ``[T]`` token tensor with ``cu_seqlens`` (each may continue from a
prior ``RequestState``), decode advances N states by one token. The runtime's own standalone
forwards (``runner.standalone``) go through the runner's layer loop instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch

from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.models.layers.linear_mixer import at
from hypic_agent.runtime.state import AttentionLayerState, LayerState, LinearLayerState, RequestState


def cu_seqlens_of(lengths: Sequence[int], device: torch.device) -> torch.Tensor:
    """``[N+1]`` int32 cumulative lengths."""
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    if lengths:
        cu[1:] = torch.cumsum(torch.tensor(list(lengths), dtype=torch.int32), 0)
    return cu.to(device)


def _empty_states(model: HybridForCausalLM, device: torch.device, dtype: torch.dtype) -> list[LayerState]:
    cfg = model.config
    out: list[LayerState] = []
    for kind in cfg.layer_types:
        if kind == "linear":
            rec = torch.zeros(cfg.linear_state_shape, device=device, dtype=torch.float32)
            conv = torch.zeros(cfg.linear_conv_dim, cfg.linear_conv_kernel_dim - 1, device=device, dtype=dtype)
            out.append(LinearLayerState(rec, conv))
        else:
            k_row, v_row = cfg.attention_cache_rows
            out.append(
                AttentionLayerState(
                    torch.zeros(0, *k_row, device=device, dtype=dtype),
                    torch.zeros(0, *v_row, device=device, dtype=dtype),
                )
            )
    return out


def new_state(model: HybridForCausalLM) -> RequestState:
    p = next(model.parameters())
    return RequestState(_empty_states(model, p.device, p.dtype), 0)


@torch.no_grad()
def prefill(
    model: HybridForCausalLM,
    seqs: Sequence[Sequence[int]],
    states: Sequence[RequestState | None] | None = None,
    *,
    all_logits: bool = False,
) -> list[RequestState]:
    """Prefill N sequences as one packed batch, each continuing from ``states[i]`` (or empty).

    Returns new ``RequestState`` objects (inputs are not modified); ``last_logits`` is set.
    With ``all_logits`` the states also carry ``all_logits [L_i, vocab]`` as an attribute.
    """
    if not seqs or any(len(s) == 0 for s in seqs):
        raise ValueError("prefill needs at least one non-empty sequence")
    p = next(model.parameters())
    dev = p.device
    prior = [s if s is not None else new_state(model) for s in (states or [None] * len(seqs))]
    lengths = [len(s) for s in seqs]
    ids = torch.tensor([t for s in seqs for t in s], dtype=torch.long, device=dev)
    cu_host = cu_seqlens_of(lengths, torch.device("cpu"))  # attention reads bounds here: no device sync
    cu = cu_host.to(dev)
    bounds = cu_host.tolist()
    pos = torch.cat([torch.arange(st.length, st.length + n, device=dev) for st, n in zip(prior, lengths, strict=True)])
    h = model.embed(ids)
    new_layers: list[list[LayerState]] = [[] for _ in seqs]
    for i, layer in enumerate(model.layers):
        inputs = layer.mixer_in(h)
        if layer.linear_attn is not None:
            init = torch.stack([st.layers[i].recurrent for st in prior])  # type: ignore[union-attr]
            conv = torch.stack([st.layers[i].conv for st in prior])  # type: ignore[union-attr]
            ops, conv_final = layer.linear_attn.convolve(*inputs, cu, conv, **at(layer.linear_attn, pos))
            o, final = layer.linear_attn.mix(ops, cu, init)
            extra: tuple[torch.Tensor, ...] = tuple(inputs[1:2])
            for j in range(len(seqs)):
                new_layers[j].append(LinearLayerState(final[j], conv_final[j]))
        else:
            attn = layer.self_attn
            assert attn is not None
            q, k, v = inputs[:3]
            extra = inputs[3:]  # the output gate, if any
            q, k = attn.rotate(q, pos), attn.rotate(k, pos)
            ks, vs, klens = [], [], []
            for j, st in enumerate(prior):
                past: AttentionLayerState = st.layers[i]  # type: ignore[assignment]
                a, b = bounds[j], bounds[j + 1]
                kj = torch.cat([past.k, k[a:b]]) if past.k.shape[0] else k[a:b]
                vj = torch.cat([past.v, v[a:b]]) if past.v.shape[0] else v[a:b]
                ks.append(kj)
                vs.append(vj)
                klens.append(kj.shape[0])
                new_layers[j].append(AttentionLayerState(kj, vj))
            o = attn.attend(q, torch.cat(ks), torch.cat(vs), cu_host, cu_seqlens_of(klens, torch.device("cpu")))
        h = layer.mixer_out(h, o, *extra)
    last_idx = (cu[1:] - 1).long()
    logits = model.logits(h if all_logits else h[last_idx])
    out = []
    for j, (st, s) in enumerate(zip(prior, seqs, strict=True)):
        ns = RequestState(new_layers[j], st.length + len(s), tokens=list(st.tokens) + list(s))
        if all_logits:
            a, b = bounds[j], bounds[j + 1]
            ns.last_logits = logits[b - 1]
            ns.all_logits = logits[a:b]  # type: ignore[attr-defined]
        else:
            ns.last_logits = logits[j]
        out.append(ns)
    return out


@torch.no_grad()
def decode_step(model: HybridForCausalLM, states: Sequence[RequestState], tokens: Sequence[int]) -> None:
    """Advance each state by one token in place; sets ``last_logits``."""
    dev = next(model.parameters()).device
    ids = torch.tensor(list(tokens), dtype=torch.long, device=dev)
    pos = torch.tensor([st.length for st in states], dtype=torch.long, device=dev)
    n = len(states)
    h = model.embed(ids)
    for i, layer in enumerate(model.layers):
        x = layer.input_layernorm(h)
        if layer.linear_attn is not None:
            lin = [cast(LinearLayerState, st.layers[i]) for st in states]
            y, new, conv = layer.linear_attn.step(
                x, torch.stack([s.recurrent for s in lin]), torch.stack([s.conv for s in lin]),
                **at(layer.linear_attn, pos),
            )  # fmt: skip
            for j, st in enumerate(states):
                st.layers[i] = LinearLayerState(new[j], conv[j])
        else:
            attn = layer.self_attn
            assert attn is not None
            q, k, v, gate = attn.qkv(x)
            q, k = attn.rotate(q, pos), attn.rotate(k, pos)
            ks, vs = [], []
            for j, st in enumerate(states):
                past: AttentionLayerState = st.layers[i]  # type: ignore[assignment]
                kj, vj = torch.cat([past.k, k[j : j + 1]]), torch.cat([past.v, v[j : j + 1]])
                st.layers[i] = AttentionLayerState(kj, vj)
                ks.append(kj)
                vs.append(vj)
            o = attn.attend(
                q,
                torch.cat(ks),
                torch.cat(vs),
                cu_seqlens_of([1] * n, torch.device("cpu")),  # host bounds: no device sync
                cu_seqlens_of([t.shape[0] for t in ks], torch.device("cpu")),
            )
            y = attn.output(o, gate)
        h = layer.feed_forward(layer.residual(h, y))
    logits = model.logits(h)
    for j, st in enumerate(states):
        st.length += 1
        st.tokens.append(int(tokens[j]))
        st.last_logits = logits[j]
