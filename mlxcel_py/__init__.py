"""mlxcel-py: a Python CLI mirroring mlxcel, with speculative decoding on MLX."""

__version__ = "0.1.0"
