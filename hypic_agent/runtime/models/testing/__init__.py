"""Models with seeded weights instead of a checkpoint's: what the tests run, and the ``tiny:<arch>``
and ``random:<config.json>`` sources the catalog serves.

``tiny``: a small transformers config per family plus its seeded weights (transformers' own model is
the oracle on the same weights; ``tiny_bailing`` and ``tiny_falcon`` hold the longer configs);
``random_weights``: a real config at full size with seeded draws on the device (for measurements).
"""
