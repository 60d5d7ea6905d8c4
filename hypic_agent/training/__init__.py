"""Distillation of an all-attention Llama (SmolLM2-135M-Instruct) into a Qwen3.5-style hybrid.

Reading order: ``teacher`` (weights + tokenizer + base reference) -> ``data`` (offline corpus) ->
``calibrate`` + ``convert`` (student config and initial weights) -> ``forward`` / ``gdn_train``
(differentiable batched forward) -> ``losses`` / ``step`` -> ``distill`` (the loop, checkpoints
in ``checkpoint``) -> ``delta`` (the model on disk: new tensors + base reference, loader hook).
``bench``, ``prepare`` and ``transfer`` take the run to a GPU machine. See ``docs/models.md``.
"""
