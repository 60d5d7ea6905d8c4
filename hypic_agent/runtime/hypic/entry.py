"""``SegmentEntry``: what a segment's isolated prefill leaves behind for reuse anywhere.

For every linear layer: the body transition pair ``T [HV, K, K]``, ``S [HV, K, V]`` (fp32 by
default) over tokens ``seam..n-1`` and the conv tail ``[C, W-1]`` (last W-1 conv inputs of the
segment). For every attention layer: un-rotated keys and values ``[n, Hkv, D]`` of all n tokens
(seam rows are replaced by fresh ones at reuse in ``hypic`` mode); an MLA layer keeps its latent
form instead: ``k`` the un-rotated shared rope key ``[n, 1, rope]``, ``v`` the normed latent
``[n, 1, kv_lora_rank]`` (``HybridConfig.attention_cache_rows``; the model fingerprint names this
layout, so such entries never meet expanded ones). The body covers the whole segment when ``seam == 0``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hypic_agent.kernels.backend import same_device


@dataclass
class LinearEntry:
    T: torch.Tensor  # [HV, K, K]
    S: torch.Tensor  # [HV, K, V]
    conv_tail: torch.Tensor  # [C, W-1]


@dataclass
class AttentionEntry:
    k: torch.Tensor  # [n, Hkv, D] un-rotated (MLA: rope keys [n, 1, rope])
    v: torch.Tensor  # [n, Hkv, D] (MLA: latents [n, 1, kv_lora_rank])


@dataclass(frozen=True)
class SplicePointers:
    """One entry's data pointers for the splice tables: per linear layer its conv tail, per attention
    layer its (keys, values), and their one dtype."""

    conv: torch.Tensor  # [n_linear] int64 (host)
    kv: torch.Tensor  # [n_attention, 2] int64 (host)
    dtype: torch.dtype


@dataclass
class SegmentEntry:
    token_ids: tuple[int, ...]
    seam: int  # tokens 0..seam-1 are the seam window, seam..n-1 the cached body
    layers: list[LinearEntry | AttentionEntry]
    prefill_ms: float = 0.0  # cost of building it (what a hit saves)
    # host-side caches (entries are immutable once built): the device all tensors live on (None: mixed
    # or not checked yet) and the linear layers' pair pointers for the fused combine scan
    _device: torch.device | None = field(default=None, init=False, repr=False, compare=False)
    _pointers: tuple[torch.Tensor, torch.dtype] | None = field(default=None, init=False, repr=False, compare=False)
    _splice: SplicePointers | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    def nbytes(self) -> int:
        total = 0
        for e in self.layers:
            if isinstance(e, LinearEntry):
                total += e.T.nbytes + e.S.nbytes + e.conv_tail.nbytes
            else:
                total += e.k.nbytes + e.v.nbytes
        return total

    def bytes_per_layer(self) -> dict[str, int]:
        """Bytes of one linear layer's pair (+tail) and one attention layer's KV."""
        out: dict[str, int] = {}
        for e in self.layers:
            if isinstance(e, LinearEntry) and "linear" not in out:
                out["linear"] = e.T.nbytes + e.S.nbytes + e.conv_tail.nbytes
            elif isinstance(e, AttentionEntry) and "attention" not in out:
                out["attention"] = e.k.nbytes + e.v.nbytes
        return out

    # ------------------------------------------------------------------ (de)serialization
    def to_tensors(self) -> dict[str, torch.Tensor]:
        """Flat ``name -> tensor`` dict for the store (safetensors-compatible)."""
        out: dict[str, torch.Tensor] = {
            "token_ids": torch.tensor(self.token_ids, dtype=torch.int32),
            "seam": torch.tensor([self.seam], dtype=torch.int32),
            "prefill_ms": torch.tensor([self.prefill_ms], dtype=torch.float64),
        }
        for i, e in enumerate(self.layers):
            if isinstance(e, LinearEntry):
                out[f"l{i}.T"], out[f"l{i}.S"], out[f"l{i}.conv"] = e.T, e.S, e.conv_tail
            else:
                out[f"l{i}.k"], out[f"l{i}.v"] = e.k, e.v
        return out

    @staticmethod
    def from_tensors(t: dict[str, torch.Tensor], layer_kinds: tuple[str, ...]) -> SegmentEntry:
        layers: list[LinearEntry | AttentionEntry] = []
        for i, kind in enumerate(layer_kinds):
            if kind == "linear":
                layers.append(LinearEntry(t[f"l{i}.T"], t[f"l{i}.S"], t[f"l{i}.conv"]))
            else:
                layers.append(AttentionEntry(t[f"l{i}.k"], t[f"l{i}.v"]))
        return SegmentEntry(
            token_ids=tuple(int(x) for x in t["token_ids"].tolist()),
            seam=int(t["seam"][0]),
            layers=layers,
            prefill_ms=float(t["prefill_ms"][0]) if "prefill_ms" in t else 0.0,
        )

    def pair_pointers(self) -> tuple[torch.Tensor, torch.dtype]:
        """``[n_linear, 2]`` int64 host tensor of each linear layer's (T, S) data pointers, and the pairs'
        dtype; computed once per entry (what ``combine_inputs.pair_tables`` stacks per request).
        Raises ``ValueError`` for non-contiguous pairs or mixed dtypes."""
        if self._pointers is None:
            lin = [e for e in self.layers if isinstance(e, LinearEntry)]
            dtypes = {t.dtype for e in lin for t in (e.T, e.S)}
            if len(dtypes) > 1 or not all(e.T.is_contiguous() and e.S.is_contiguous() for e in lin):
                raise ValueError("combine scan needs contiguous pairs of one dtype")
            ptrs = torch.tensor([(e.T.data_ptr(), e.S.data_ptr()) for e in lin], dtype=torch.int64)
            self._pointers = (ptrs.reshape(-1, 2), dtypes.pop() if dtypes else torch.float32)
        return self._pointers

    def splice_pointers(self) -> SplicePointers:
        """Data pointers of the conv tails and attention keys / values (``runtime.hypic.splice``);
        computed once per entry. Raises ``ValueError`` for non-contiguous tensors or mixed dtypes."""
        if self._splice is None:
            lin = [e for e in self.layers if isinstance(e, LinearEntry)]
            att = [e for e in self.layers if isinstance(e, AttentionEntry)]
            tails, kv = [e.conv_tail for e in lin], [t for e in att for t in (e.k, e.v)]
            if not all(t.is_contiguous() for t in (*tails, *kv)):
                raise ValueError("splicing by pointer needs contiguous conv tails, keys and values")
            dtypes = {t.dtype for t in (*tails, *kv)}
            if len(dtypes) > 1:
                raise ValueError(f"splicing by pointer needs one dtype, got {sorted(map(str, dtypes))}")
            self._splice = SplicePointers(
                torch.tensor([t.data_ptr() for t in tails], dtype=torch.int64),
                torch.tensor([(e.k.data_ptr(), e.v.data_ptr()) for e in att], dtype=torch.int64).reshape(-1, 2),
                dtypes.pop() if dtypes else torch.float32,
            )
        return self._splice

    def device(self) -> torch.device | None:
        """The device every tensor lives on (None when they are spread over several); checked once."""
        if self._device is None:
            devs = {t.device for e in self.layers for t in vars(e).values()}
            self._device = devs.pop() if len(devs) == 1 else None
        return self._device

    def to(self, device: torch.device | str) -> SegmentEntry:
        dev = torch.device(device)
        here = self.device()
        if here is not None and same_device(here, dev):
            return self  # already there (GPU-tier hits): no per-tensor calls
        layers: list[LinearEntry | AttentionEntry] = []
        for e in self.layers:
            if isinstance(e, LinearEntry):
                layers.append(LinearEntry(e.T.to(device), e.S.to(device), e.conv_tail.to(device)))
            else:
                layers.append(AttentionEntry(e.k.to(device), e.v.to(device)))
        return SegmentEntry(self.token_ids, self.seam, layers, self.prefill_ms)
