"""One distillation optimizer step (shared by ``distill.run_distill`` and ``bench``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.training.forward import layer_inputs_of, run_model
from hypic_agent.training.gdn_train import GdnFn
from hypic_agent.training.hypic_forward import SegmentPlan, hypic_run
from hypic_agent.training.losses import hidden_loss, kl_loss


@dataclass(frozen=True)
class StepOptions:
    kl_weight: float = 1.0
    hidden_weight: float = 0.0
    temperature: float = 1.0
    clip: float = 1.0
    grad_checkpoint: bool = False


@dataclass
class StepResult:
    """Device scalars (no host sync until read)."""

    loss: torch.Tensor
    kl: torch.Tensor
    hidden: torch.Tensor
    grad_norm: torch.Tensor


def train_step(
    student: HybridForCausalLM,
    teacher: HybridForCausalLM,
    ids: torch.Tensor,
    opt: torch.optim.Optimizer,
    params: list[torch.nn.Parameter],
    gdn: GdnFn,
    o: StepOptions,
    *,
    local: bool = False,
    cached: SegmentPlan | None = None,
) -> StepResult:
    """Teacher forward (no grad), student forward + backward, clip, AdamW step; ids ``[B, L]``.

    ``local``: every student layer reads the teacher's input of that layer and only the
    per-layer hidden loss trains (layer-local distillation); else KL (+ hidden loss).
    ``cached``: the student runs as the ``hypic`` mode serves it (segments of the plan cached in
    isolation, seams and suffix recomputed; ``hypic_forward``) and the KL is taken at those active
    tokens against the one-pass teacher: training for cached prefill.
    """
    dev = ids.device
    zero = torch.zeros((), device=dev)
    need_h = (local or o.hidden_weight > 0) and cached is None
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        with torch.no_grad():
            t_out = run_model(teacher, ids, gdn=gdn, capture=need_h)
            inputs = layer_inputs_of(teacher.embed(ids), t_out.hiddens) if local else None
        if cached is not None:
            c_out = hypic_run(student, ids, cached, gdn=gdn, grad_checkpoint=o.grad_checkpoint)
            t_act = t_out.final[:, c_out.active]
            kl = kl_loss(student, teacher, c_out.final, t_act, temperature=o.temperature)
            hid, loss = zero, o.kl_weight * kl
        else:
            s_out = run_model(
                student, ids, gdn=gdn, capture=need_h, layer_inputs=inputs, grad_checkpoint=o.grad_checkpoint
            )
            hid = hidden_loss(s_out.hiddens, t_out.hiddens) if need_h else zero
            kl = zero if local else kl_loss(student, teacher, s_out.final, t_out.final, temperature=o.temperature)
            loss = hid if local else o.kl_weight * kl + o.hidden_weight * hid
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(params, o.clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return StepResult(loss.detach(), kl.detach(), hid.detach(), gnorm)
