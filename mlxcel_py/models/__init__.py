"""Models: finding a model's files (folder, GGUF, hub cache, the default model), checking them
before any weight is read, loading through mlx-lm, and the parts of a loaded model and its caches
that the rest of mlxcel-py reads (taps, families, cache kinds)."""

import os

# mlx-lm's tokenizer loader imports transformers, which advises on stderr that PyTorch is missing;
# mlx-lm needs only its tokenizers (a user's own setting wins)
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
