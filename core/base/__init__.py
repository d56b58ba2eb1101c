"""The base layer: the vocabulary every other core package shares and that imports nothing of the project.

``ggml_types`` is the ggml tensor type table (one row per type id); ``gguf_constants`` the GGUF container's
magic, value types, limits and ``general.file_type`` enum. The container (``gguf``, ``bump``), the kernels
(``native``) and the codecs (``quant``) build on it; ``tests/test_layers.py`` keeps it at the bottom."""
