"""Models: finding a model's files (folder, GGUF, hub cache, the default model), checking them
before any weight is read, loading through mlx-lm, and the parts of a loaded model and its caches
that the rest of mlxcel-py reads (taps, families, cache kinds)."""
