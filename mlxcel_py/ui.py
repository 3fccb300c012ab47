"""Terminal presentation: the only rich importer. stdout gets generated text only; everything
else (model info, warnings, errors, profile tables, chat chrome) goes to stderr.

`exit_on_error()` is the one boundary that turns an MlxcelError into `error: ...` + exit code.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import typer
from rich.console import Console
from rich.table import Table
from rich.theme import Theme

from .errors import MlxcelError

THEME = Theme({"ui.muted": "dim", "ui.accent": "cyan", "ui.good": "green", "ui.warn": "yellow", "ui.err": "bold red"})
_err: Console | None = None


def err() -> Console:
    global _err
    if _err is None:
        _err = Console(stderr=True, theme=THEME, highlight=False, soft_wrap=True)
    return _err


def info(message: str) -> None:
    err().print(message, style="ui.muted", markup=False)


def warn(message: str) -> None:
    err().print(f"warning: {message}", style="ui.warn", markup=False)


def write_out(text: str) -> None:
    """Generated content to stdout, unstyled and flushed per piece (pipeable)."""
    sys.stdout.write(text)
    sys.stdout.flush()


@contextlib.contextmanager
def exit_on_error() -> Iterator[None]:
    try:
        yield
    except MlxcelError as exc:
        err().print(f"error: {exc.message}", style="ui.err", markup=False)
        if exc.hint:
            err().print(f"hint: {exc.hint}", style="ui.muted", markup=False)
        raise typer.Exit(exc.exit_code) from None


def profile_table(rows: list[tuple[str, str]], title: str = "Profile") -> None:
    table = Table(title=title, show_header=False, title_justify="left", box=None, pad_edge=False)
    table.add_column("metric", style="ui.accent")
    table.add_column("value", justify="right")
    for k, v in rows:
        table.add_row(k, v)
    err().print(table)
