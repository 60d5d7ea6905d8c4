"""Gated delta rule for training: batched equal-length sequences, differentiable, backend-selectable.

Layouts (batch-first, like fla): q, k ``[B, L, H, K]``; v ``[B, L, HV, V]``; g (log decay) and
beta ``[B, L, HV]``; output ``[B, L, HV, V]``. Zero initial state, no final state: training
sequences are independent blocks.

Backends:

* ``torch``: chunked WY/UT algorithm in plain PyTorch with autograd (fp32 inside, autocast off).
  One batched triangular solve per chunk, then a scan over the ``L / chunk`` chunks.
* ``fla``: fla-core's ``chunk_gated_delta_rule`` (Triton forward *and* backward). fla 0.6 refuses
  its backward on Hopper with Triton < 3.7.1 (wrong gradients, fla issue #640), so it is only
  chosen there when Triton >= 3.7.1 is importable.
* ``auto``: ``fla`` when usable for training on this device, else ``torch``.

``check_gradients`` compares a backend against the per-token recurrence with autograd.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

import torch
import torch.nn.functional as F

from hypic_agent.errors import InvalidRequestError

CHUNK = 64
BACKENDS = ("auto", "torch", "fla")
_FLA_MIN_TRITON_HOPPER = (3, 7, 1)


def _version_tuple(v: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in v.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


@functools.cache
def fla_training_status(device_index: int = 0) -> tuple[bool, str]:
    """(usable, reason): whether fla's GDN forward + backward may be used for training here."""
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    try:
        importlib.import_module("fla.ops.gated_delta_rule")
        triton = importlib.import_module("triton")
    except Exception as e:  # ImportError or a broken install
        return False, f"fla-core / triton not importable ({e.__class__.__name__}: {e})"
    tv = _version_tuple(getattr(triton, "__version__", "0"))
    major, _ = torch.cuda.get_device_capability(device_index)
    if major == 9 and tv < _FLA_MIN_TRITON_HOPPER:
        return False, (
            f"triton {triton.__version__} on a Hopper GPU: fla's GDN backward gives wrong gradients "
            "(fla #640); bring triton >= 3.7.1 or use --gdn torch"
        )
    return True, f"fla with triton {triton.__version__}"


def resolve_gdn_backend(name: str, device: torch.device | str) -> str:
    """``auto`` | ``torch`` | ``fla`` -> the backend that will run (raises if ``fla`` is unusable)."""
    if name not in BACKENDS:
        raise InvalidRequestError(f"unknown GDN training backend {name!r}; use one of {BACKENDS}", param="gdn")
    dev = torch.device(device)
    if name == "torch":
        return "torch"
    ok, why = fla_training_status(dev.index or 0) if dev.type == "cuda" else (False, "not a CUDA device")
    if name == "fla" and not ok:
        raise InvalidRequestError(f"--gdn fla is not usable here: {why}", param="gdn")
    return "fla" if ok else "torch"


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim (fla / transformers convention)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _prepare(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, scale: float | None
) -> tuple[torch.Tensor, ...]:
    """Float (>= fp32) copies, L2-normed q/k expanded to the value heads, q scaled."""
    h, hv = k.shape[-2], v.shape[-2]
    if q.shape != k.shape or hv % h:
        raise ValueError(f"need q, k [B, L, H, K] equal and HV % H == 0; got {tuple(q.shape)}, {tuple(v.shape)}")
    dt = torch.promote_types(q.dtype, torch.float32)
    q, k, v, g, beta = (x.to(dt) for x in (q, k, v, g, beta))
    q, k = l2norm(q), l2norm(k)
    if hv != h:
        q, k = q.repeat_interleave(hv // h, dim=-2), k.repeat_interleave(hv // h, dim=-2)
    return q * (q.shape[-1] ** -0.5 if scale is None else scale), k, v, g, beta


def chunk_gdn_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    chunk: int = CHUNK,
) -> torch.Tensor:
    """Chunked gated delta rule with autograd. Shapes as in the module docstring; returns o in q's dtype."""
    out_dtype = q.dtype
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v, g, beta = _prepare(q, k, v, g, beta, scale)
        B, L, HV, K = k.shape
        V = v.shape[-1]
        n = (L + chunk - 1) // chunk
        pad = n * chunk - L
        if pad:  # identity tokens: k = v = q = 0, g = beta = 0
            q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
            g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))
        # [B, HV, n, C, .]
        q, k, v = (x.view(B, n, chunk, HV, -1).permute(0, 3, 1, 2, 4) for x in (q, k, v))
        g, beta = (x.view(B, n, chunk, HV).permute(0, 3, 1, 2) for x in (g, beta))
        cum = g.cumsum(-1)
        upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
        pair = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp()
        kb = k * beta[..., None]
        a = (kb @ k.transpose(-1, -2)) * pair
        rhs = torch.cat([v * beta[..., None], kb * cum.exp()[..., None]], dim=-1)
        sol = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
        u, w = sol.split([V, K], dim=-1)
        attn = (q @ k.transpose(-1, -2)) * pair
        qd = q * cum.exp()[..., None]
        kd_t = (k * (cum[..., -1:] - cum).exp()[..., None]).transpose(-1, -2)  # [B, HV, n, K, C]
        decay = cum[..., -1].exp()[..., None, None]  # [B, HV, n, 1, 1]
        s = q.new_zeros(B, HV, K, V)
        outs = []
        for c in range(n):
            v_new = u[:, :, c] - w[:, :, c] @ s
            outs.append(qd[:, :, c] @ s + attn[:, :, c] @ v_new)
            s = s * decay[:, :, c] + kd_t[:, :, c] @ v_new
        o = torch.stack(outs, dim=2)  # [B, HV, n, C, V]
        o = o.permute(0, 2, 3, 1, 4).reshape(B, n * chunk, HV, V)[:, :L]
    return o.to(out_dtype)


def recurrent_gdn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """Per-token reference with autograd (slow): same shapes and semantics as ``chunk_gdn_torch``."""
    q, k, v, g, beta = _prepare(q, k, v, g, beta, scale)
    B, L, HV, K = k.shape
    s = q.new_zeros(B, HV, K, v.shape[-1])
    outs = []
    for t in range(L):
        s = s * g[:, t].exp()[..., None, None]
        delta = (v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], s)) * beta[:, t, :, None]
        s = s + k[:, t, ..., None] * delta[..., None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], s))
    return torch.stack(outs, dim=1)


def chunk_gdn_fla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """fla-core's chunked kernel (forward + backward in Triton); bf16/fp16/fp32 q, k, v."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    dt = q.dtype if q.dtype in (torch.bfloat16, torch.float16) else torch.get_autocast_dtype("cuda")
    if not torch.is_autocast_enabled("cuda"):
        dt = q.dtype
    o, _ = chunk_gated_delta_rule(
        q.to(dt).contiguous(),
        k.to(dt).contiguous(),
        v.to(dt).contiguous(),
        g.float().contiguous(),
        beta.to(dt).contiguous(),
        scale=scale,
        output_final_state=False,
        use_qk_l2norm_in_kernel=True,
    )
    return o


GdnFn = Callable[..., torch.Tensor]


def gdn_function(backend: str, *, compile: bool = False, chunk: int = CHUNK) -> GdnFn:
    """The training GDN op for a resolved backend (``torch`` may be wrapped in ``torch.compile``)."""
    if backend == "fla":
        return chunk_gdn_fla
    if backend != "torch":
        raise InvalidRequestError(f"resolve the backend first (got {backend!r})", param="gdn")
    fn: GdnFn = chunk_gdn_torch if chunk == CHUNK else functools.partial(chunk_gdn_torch, chunk=chunk)
    return torch.compile(fn, dynamic=False) if compile else fn


def check_gradients(
    fn: GdnFn,
    *,
    B: int = 2,
    L: int = 100,
    H: int = 2,
    HV: int = 2,
    K: int = 16,
    V: int = 16,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
) -> dict[str, float]:
    """Relative max error of ``fn``'s output and the five input gradients vs ``recurrent_gdn``."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, s: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * s).to(device)

    base = {
        "q": rnd(B, L, H, K),
        "k": rnd(B, L, H, K),
        "v": rnd(B, L, HV, V),
        "g": -F.softplus(rnd(B, L, HV)) * 0.5,
        "beta": torch.sigmoid(rnd(B, L, HV)),
    }
    cot = rnd(B, L, HV, V)
    results: list[tuple[torch.Tensor, dict[str, torch.Tensor]]] = []
    for f, dt in ((fn, dtype), (recurrent_gdn, torch.float64)):
        inp = {n: t.to(dt).detach().clone().requires_grad_() for n, t in base.items()}
        out = f(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"])
        (out.double() * cot).sum().backward()
        results.append((out.detach().double(), {n: t.grad.detach().double() for n, t in inp.items()}))  # type: ignore[union-attr]
    (o, grads), (o_ref, grads_ref) = results

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))

    errs = {"o": rel(o, o_ref)}
    errs.update({f"d{n}": rel(grads[n], grads_ref[n]) for n in base})
    return errs
