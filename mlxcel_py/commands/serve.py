"""Serve the model over HTTP (OpenAI and llama-server compatible), speculative per request."""

from __future__ import annotations

import os

from ..cpu import blas
from ..terminal import ui
from ..validate import validate
from ._options import (
    DISTRIBUTED_PARAMS,
    LOOKUP_PARAMS_HIDDEN,
    MODEL_PARAMS,
    RUNTIME_PARAMS,
    SERVE_SAMPLING_PARAMS,
    SERVER_PARAMS,
    SPEC_PARAMS,
    WINDOW_PARAMS,
    ServeMaxTokensOpt,
    _kw,
    build_options,
)
from ._signature import with_params

EPILOG = (
    "Examples:\n\n"
    "  mlxcel serve --draft-kind prompt-lookup --port 8080\n\n"
    "  mlxcel serve -m ./Llama-3.1-8B --draft-model ./Llama-3.2-1B --port 0"
)

SERVE_PARAMS = (
    MODEL_PARAMS
    + [_kw("max_tokens", ServeMaxTokensOpt, -1)]
    + SERVE_SAMPLING_PARAMS
    + SPEC_PARAMS
    + LOOKUP_PARAMS_HIDDEN
    + SERVER_PARAMS
    + WINDOW_PARAMS
    + RUNTIME_PARAMS
    + DISTRIBUTED_PARAMS
)


@with_params(SERVE_PARAMS)
def serve(**params) -> None:
    """Serve the model over HTTP (OpenAI and llama-server compatible), speculative per request."""
    with ui.exit_on_error():
        cfg = validate(build_options("serve", params))
        if cfg.options.server.threads:  # read by OpenBLAS when it loads, so set before prepare()
            os.environ["OPENBLAS_NUM_THREADS"] = str(cfg.options.server.threads)
            os.environ["MLXCEL_KERNEL_THREADS"] = str(cfg.options.server.threads)  # the row-exact kernel's
        if cfg.options.model.hf_repo and not cfg.options.server.router:
            cfg = _preset_repo(cfg)  # an -hf repo holding a preset.ini is served as a router over it
        if cfg.options.server.router:  # router mode: no model in this process
            import sys

            from ..server.router.main import run_router
            from ._router_argv import child_argv, read_preset, serve_arguments

            path = cfg.options.server.models_preset
            argv = child_argv(serve_arguments(sys.argv), serve)
            run_router(
                cfg,
                argv,
                preset=read_preset(path, serve),
                read_preset=lambda: read_preset(path, serve),
                say=ui.info,
                warn=ui.warn,
            )
            return
        blas.prepare(cfg.options.model.blas)
        from ..server.main import run_server
        from ._ranks import ranks

        with ranks(cfg) as world:
            run_server(cfg, say=ui.info, warn=ui.warn, world=world)


def _preset_repo(cfg):
    """llama-server's remote presets: `-hf OWNER/NAME` of a repo with a preset.ini (and no model
    file) runs the router over that preset; any other repo is a model, fetched at load."""
    from dataclasses import replace

    from ..models import hub

    preset = hub.preset_file(cfg.options.model.hf_repo)
    if preset is None:
        return cfg
    ui.info(f"--hf-repo {cfg.options.model.hf_repo} is a preset repo: serving its models ({preset})")
    opts = cfg.options
    server = replace(opts.server, models_preset=str(preset))
    return replace(cfg, options=replace(opts, server=server, model=replace(opts.model, hf_repo=None)))


def server_main() -> None:
    """The `mlxcel-server` console script: the serve flags, no subcommand."""
    import typer

    from ._stdio import std_streams

    std_streams()

    import sys

    from ._help import GroupedHelpCommand
    from ._spelling import long_flags, respell

    app = typer.Typer(add_completion=False, context_settings={"help_option_names": ["-h", "--help", "--usage"]})
    app.command(help=serve.__doc__, cls=GroupedHelpCommand)(serve)
    sys.argv[1:] = respell(sys.argv[1:], long_flags(typer.main.get_command(app)))  # llama.cpp's --ctx_size spelling
    app()
