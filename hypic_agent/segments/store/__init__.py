"""Storage of segment entries: ``SegmentStore`` over a ``Registry`` (SQLAlchemy rows) and tiers
GPU -> CPU -> disk (safetensors files that describe their own rows), with tenant quotas,
cost-aware eviction and start-up recovery. Payloads are opaque ``dict[str, Tensor]``.
"""
