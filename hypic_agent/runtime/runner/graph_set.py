"""``GraphSet``: every CUDA graph of a model's forwards, held by its ``ModelRunner``.

* ``stages``: the token-local stages per (stage, layer, token bucket) (``stage_graphs.LayerGraphs``),
  replayed inside eager forwards (prefill chunks, mixed steps, cold builds, combines);
* ``combines``: whole combine forwards per layout (``combine_graphs.CombineGraphs``);
* ``colds``: the linear layers' cold core per cold-batch layout (``cold_graphs.ColdGraphs``);

and, once the runner serves a state pool, the whole decode step per batch bucket
(``decode_graphs.DecodeGraphs``, ``ModelRunner.attach``). Nothing is parked on the model: a forward
is handed the graphs it may replay, and a capture of a bigger graph hands its forward none (its
stages are captured inside it instead of replayed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hypic_agent.config import Settings
from hypic_agent.kernels.config import KernelConfig
from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.runner.cold_graphs import ColdGraphs
from hypic_agent.runtime.runner.combine_graphs import CombineGraphs
from hypic_agent.runtime.runner.stage_graphs import LayerGraphs, bucket_sizes


@dataclass
class GraphSet:
    stages: LayerGraphs | None = None
    combines: CombineGraphs | None = None
    colds: ColdGraphs | None = None

    @classmethod
    def of(cls, model: HybridForCausalLM, settings: Settings, kernels: KernelConfig, device: torch.device) -> GraphSet:
        """The graphs ``settings`` enable on ``device`` (none off CUDA or with ``cuda_graphs`` off)."""
        if not settings.cuda_graphs or device.type != "cuda":
            return cls()
        s = settings
        return cls(
            LayerGraphs(model, bucket_sizes(kernels.graph_bucket_step, kernels.graph_max_tokens)),
            CombineGraphs(model, s.combine_graph_after, s.combine_graphs_max),
            ColdGraphs(s.cold_graph_after, s.cold_graphs_max) if s.cold_graph_after > 0 else None,
        )
