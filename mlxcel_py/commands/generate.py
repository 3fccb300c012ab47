"""Generate text for a prompt (-p) to stdout; without -p, an interactive chat."""

from __future__ import annotations

from ..cpu import blas
from ..terminal import ui
from ..validate import validate
from ._options import ALL_MODEL_SIDE, build_options
from ._ranks import ranks
from ._signature import with_params

EPILOG = (
    "Examples:\n\n"
    "  mlxcel generate -p 'Fix the typos: teh cat' --prompt-lookup\n\n"
    "  cat notes.txt | mlxcel generate -p - --prompt-lookup --profile\n\n"
    "  mlxcel generate -m ./Llama-3.1-8B --draft-model ./Llama-3.2-1B -p 'Hello'"
)


def generate_or_chat(command: str, params: dict) -> None:
    """The body of `generate` and `run`: one completion with -p, else the interactive chat."""
    with ui.exit_on_error():
        run = validate(build_options(command, params))
        blas.prepare(run.options.model.blas)
        with ranks(run) as world:
            if run.options.generation.prompt is None:
                from ._repl import run_chat

                run_chat(run, world)
                return
            from ._oneshot import run_oneshot

            run_oneshot(run, world)


@with_params(ALL_MODEL_SIDE)
def generate(**params) -> None:
    """Generate text for a prompt (-p) to stdout; without -p, an interactive chat."""
    generate_or_chat("generate", params)
