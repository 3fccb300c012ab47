"""Chat with the model in the terminal (streaming, /help, /clear, /bye, \"\"\" blocks)."""

from __future__ import annotations

from ..cpu import blas
from ..terminal import ui
from ..validate import validate
from ._options import CHAT_SIDE, build_options
from ._ranks import ranks
from ._signature import with_params

EPILOG = "Examples:\n\n  mlxcel chat\n\n  printf 'Hi\\nTell me a joke\\n' | mlxcel chat -n 64"


@with_params(CHAT_SIDE)
def chat(**params) -> None:
    """Chat with the model in the terminal (streaming, /help, /clear, /bye, \"\"\" blocks)."""
    with ui.exit_on_error():
        cfg = validate(build_options("chat", params))
        blas.prepare(cfg.options.model.blas)
        from ._repl import run_chat

        with ranks(cfg) as world:
            run_chat(cfg, world)
