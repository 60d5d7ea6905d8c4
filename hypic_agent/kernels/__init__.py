"""Numerical ops: plain-PyTorch references and their fla-core / Triton twins (see ``backend``)."""

import os

# fla memoises chunk-index tensors by argument identity, in a queue of FLA_TENSOR_CACHE_SIZE
# (default 4) entries per helper. One linear layer of entry building asks for more distinct
# (cu_seqlens, chunk size) keys than that, so every layer missed and recomputed them with a
# device->host sync. Configures the dependency only; it must happen before fla is imported,
# and a value the user set wins.
os.environ.setdefault("FLA_TENSOR_CACHE_SIZE", "64")
