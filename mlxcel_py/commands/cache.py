"""`mlxcel cache ls|rm`: the GGUF conversions mlxcel-py keeps (models/gguf/cache.py)."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer

from ..terminal import ui

app = typer.Typer(
    name="cache",
    help="List or remove the GGUF conversions kept in the cache folder ($MLXCEL_CACHE_DIR).",
    no_args_is_help=True,
)


@app.command("ls")
def ls() -> None:
    """List the cached conversions, least recently used first (name, size, state, last use, source)."""
    from ..models.gguf import cache as conversions

    with ui.exit_on_error():
        found = conversions.entries()
        limit = conversions.limit_bytes()
    for e in found:
        state = "complete" if e.complete else "incomplete"
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used))
        ui.write_out(f"{e.name}\t{e.bytes / 2**20:.1f} MiB\t{state}\t{used}\t{e.source}\n")
    total = sum(e.bytes for e in found)
    ui.info(
        f"{len(found)} conversion(s), {total / 2**20:.1f} MiB in {conversions.root()} "
        f"(limit {limit / 2**30:g} GiB, MLXCEL_CACHE_MAX_GB)"
    )


@app.command("rm")
def rm(
    names: Annotated[
        Optional[list[str]],
        typer.Argument(
            metavar="NAME", show_default=False, help="Entries to remove (the first column of `mlxcel cache ls`)."
        ),
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Remove every conversion.")] = False,
    incomplete: Annotated[bool, typer.Option("--incomplete", help="Remove conversions that never finished.")] = False,
) -> None:
    """Remove cached conversions (they are made again from their GGUF on the next load)."""
    from ..errors import UsageError
    from ..models.gguf import cache as conversions

    with ui.exit_on_error():
        if not names and not all_ and not incomplete:
            raise UsageError("mlxcel cache rm: name the entries to remove, or pass --incomplete or --all")
        if names and (all_ or incomplete):
            raise UsageError("mlxcel cache rm: pass names or --all/--incomplete, not both")
        gone = conversions.remove(names or [], everything=all_, incomplete=incomplete)
    ui.info(f"removed {len(gone)} conversion(s), {sum(e.bytes for e in gone) / 2**20:.1f} MiB")
