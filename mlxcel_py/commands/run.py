"""Ollama-style: `mlxcel run [MODEL]`; with -p one completion, without it an interactive chat."""

from __future__ import annotations

from .. import fastpath, ui
from ..validate import validate
from ._options import CHAT_SIDE, build_options, positional_model, with_params

EPILOG = "Examples:\n\n  mlxcel run\n\n  mlxcel run ./my-model -p 'Hello'"


@with_params(positional_model(CHAT_SIDE))
def run(**params) -> None:
    """Ollama-style: `mlxcel run [MODEL]`; with -p one completion, without it an interactive chat."""
    with ui.exit_on_error():
        cfg = validate(build_options("run", params))
        fastpath.prepare((cfg).options.model.blas)
        if cfg.options.generation.prompt is None:
            from ._repl import run_chat

            run_chat(cfg)
            return
        from ._oneshot import run_oneshot

        run_oneshot(cfg)
