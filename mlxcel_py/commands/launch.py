"""Start a distributed run: N local ranks, or one per host of an MLX hostfile (ring backend)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..parallel.launcher import DEFAULT_PORT
from ..parallel.launcher import launch as start_ranks
from ..terminal import ui

EPILOG = (
    "Examples:\n\n"
    "  mlxcel launch -n 2 -- mlxcel generate -p 'Hello' --tp-size 2\n\n"
    "  mlxcel launch --hostfile hosts.json -- mlxcel serve --pp-size 2 --port 8080"
)
RANKS = "Ranks"


def launch(
    command: Annotated[
        Optional[list[str]],
        typer.Argument(
            metavar="COMMAND",
            help="The mlxcel command every rank runs, after -- (mlxcel launch -n 2 -- mlxcel chat --tp-size 2).",
            show_default=False,
        ),
    ] = None,
    n: Annotated[
        Optional[int],
        typer.Option(
            "-n",
            "--nranks",
            metavar="N",
            help="Local ranks on this machine (over the loopback).",
            rich_help_panel=RANKS,
        ),
    ] = None,
    hostfile: Annotated[
        Optional[str],
        typer.Option(
            "--hostfile",
            metavar="FILE",
            help='MLX hostfile: JSON [{"ssh": HOST, "ips": [IP]}, ...], one rank per host (rank 0 first); reached with ssh.',
            rich_help_panel=RANKS,
        ),
    ] = None,
    starting_port: Annotated[
        int,
        typer.Option(
            "--starting-port",
            metavar="PORT",
            help="First ring port; rank r listens on PORT + r.",
            rich_help_panel=RANKS,
        ),
    ] = DEFAULT_PORT,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Print each rank's command line.", rich_help_panel=RANKS)
    ] = False,
) -> None:
    """Start a distributed run: N local ranks, or one per host of an MLX hostfile (ring backend)."""
    with ui.exit_on_error():
        code = start_ranks(command or [], n=n, hostfile=hostfile, port=starting_port, verbose=verbose)
    raise typer.Exit(code)
