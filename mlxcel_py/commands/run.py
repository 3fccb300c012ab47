"""Ollama-style: `mlxcel run [MODEL]`; with -p one completion, without it an interactive chat."""

from __future__ import annotations

from ._options import CHAT_SIDE, positional_model
from ._signature import with_params
from .generate import generate_or_chat

EPILOG = "Examples:\n\n  mlxcel run\n\n  mlxcel run ./my-model -p 'Hello'\n\n  mlxcel run SmolLM2-135M-Instruct-4bit  # $MLXCEL_DEFAULT_ORG/<name>"


@with_params(positional_model(CHAT_SIDE))
def run(**params) -> None:
    """Ollama-style: `mlxcel run [MODEL]`; with -p one completion, without it an interactive chat."""
    generate_or_chat("run", params)
