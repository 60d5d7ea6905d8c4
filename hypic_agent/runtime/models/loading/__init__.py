"""Getting a model's files into tensors under the naming contract.

``weights.load_weights(source)`` is the entry point (``catalog.resolve_model`` makes the source):
``safetensors`` reads Hugging Face folders, ``gguf`` (with ``gguf_meta``) llama.cpp files, ``delta``
is the format of a distilled folder stored on top of its base; ``shapes`` says which tensors a
config needs, ``checksums`` guards the shipped weights, ``catalog`` / ``wheel_fetch`` name and fetch
models, ``tokenizer`` loads a source's tokenizer and ``fingerprint`` names what was loaded.
"""
