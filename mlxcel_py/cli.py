"""The root Typer app: registers the commands, the config file, and the error boundary in main()."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from . import __version__
from .commands import bench, cache, chat, draft, generate, launch, run, serve
from .commands._stdio import std_streams
from .errors import EXIT_INTERRUPTED, MlxcelError

app = typer.Typer(
    name="mlxcel",
    help="Fast LLM decoding on MLX with speculative decoding (prompt lookup, draft models).",
    no_args_is_help=True,
    add_completion=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mlxcel-py {__version__}")
        typer.echo(f"row-exact CPU kernel: {kernel_line()}")
        raise typer.Exit()


def kernel_line() -> str:
    """Whether the row-exact kernel was built and runs here (a quiet pip install hides its build)."""
    from .cpu import blas

    blas.prepare()  # before mlx.core, which the kernel's module loads
    from .cpu.extension import kernel_status

    qmm, why = kernel_status()
    return f"built and in use ({why})" if qmm is not None else f"{why}; CPU weights are float32"


def _option_kinds() -> dict[str, dict[str, tuple[str, bool]]]:
    group = typer.main.get_command(app)
    kinds: dict[str, dict[str, tuple[str, bool]]] = {}
    for name, cmd in group.commands.items():  # type: ignore[attr-defined]
        table = {}
        for p in cmd.params:
            if p.param_type_name != "option" or p.name is None:
                continue
            # typer's own parameters (0.29: no Click underneath) name their type: "int", "list[str]"
            bare = p.bare_type()
            kind = bare if bare in ("bool", "int", "float") else "bool" if p.is_flag else "str"
            table[p.name] = (kind, bool(p.multiple))
        kinds[name] = table
    return kinds


@app.callback()
def root(
    ctx: typer.Context,
    config: Annotated[
        Optional[Path],
        typer.Option(
            "--config",
            envvar="MLXCEL_CONFIG",
            help="TOML file of option defaults (default ~/.config/mlxcel/config.toml).",
        ),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Fast LLM decoding on MLX: prompt lookup and draft-model speculation, exact output."""
    from . import config_file, paths
    from .terminal import ui

    path = config or paths.config_file()
    if config is None and not path.exists():
        return
    with ui.exit_on_error():
        data = config_file.load_toml(path)
        ctx.default_map = config_file.default_maps(path, data, _option_kinds())


from .commands._help import GroupedHelpCommand  # noqa: E402

_plain = {"cls": GroupedHelpCommand}
app.command("generate", help=generate.__doc__, epilog=generate.EPILOG, **_plain)(generate.generate)
app.command("gen", hidden=True, **_plain)(generate.generate)
app.command("run", help=run.__doc__, epilog=run.EPILOG, **_plain)(run.run)
app.command("chat", help=chat.__doc__, epilog=chat.EPILOG, **_plain)(chat.chat)
app.command("serve", help=serve.__doc__, epilog=serve.EPILOG, **_plain)(serve.serve)
app.command("bench", help=bench.__doc__, epilog=bench.EPILOG, **_plain)(bench.bench)
app.command(
    "launch",
    help=launch.__doc__,
    epilog=launch.EPILOG,
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    **_plain,
)(launch.launch)
app.add_typer(cache.app, name="cache")
app.add_typer(draft.app, name="draft")


def main() -> None:
    std_streams()
    command = typer.main.get_command(app).commands.get(sys.argv[1]) if len(sys.argv) > 1 else None  # type: ignore[attr-defined]
    if command is not None and hasattr(command, "params"):  # llama.cpp's --ctx_size spelling too
        from .commands._spelling import long_flags, respell

        sys.argv[2:] = respell(sys.argv[2:], long_flags(command))
    try:
        app()
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        sys.exit(EXIT_INTERRUPTED)
    except MlxcelError as exc:  # raised outside a command's boundary
        sys.stderr.write(exc.format() + "\n")
        sys.exit(exc.exit_code)
