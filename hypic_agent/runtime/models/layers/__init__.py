"""The modules a decoder layer is made of.

``decoder.DecoderLayer`` (norm, token mixer, norm, feed-forward) and ``parallel_layer`` (Falcon-H1's
side-by-side mixers served as two layers); the token mixers: ``attention`` (GQA) and ``mla`` (latent
attention) for attention layers, and for fixed-state layers the ``linear_mixer.LinearMixer`` kinds
``gated_deltanet``, ``kda_mixer``, ``mamba2`` (``falcon_mamba``), ``lightning``, ``ring_linear`` and
``short_conv`` (the decay-only ones share ``decay_mixer``); ``mlp`` (dense and MoE), ``norms`` and
``fused_inputs`` (projections of one input run as one GEMM).
"""
