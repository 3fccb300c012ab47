"""Terminal presentation: the only rich importer. stdout gets generated text only; everything
else (model info, warnings, errors, profile tables, chat chrome) goes to stderr.

`exit_on_error()` is the one boundary that turns an MlxcelError into `error: ...` + exit code.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import typer
from rich.console import Console
from rich.table import Table
from rich.theme import Theme

from ..errors import MlxcelError

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
        line, _, hint = exc.format().partition("\n")
        err().print(line, style="ui.err", markup=False)
        if hint:
            err().print(hint, style="ui.muted", markup=False)
        raise typer.Exit(exc.exit_code) from None


def profile_table(rows: list[tuple[str, str]], title: str = "Profile") -> None:
    table = Table(title=title, show_header=False, title_justify="left", box=None, pad_edge=False)
    table.add_column("metric", style="ui.accent")
    table.add_column("value", justify="right")
    for k, v in rows:
        table.add_row(k, v)
    err().print(table)


def table(title: str, headers: list[str], rows: list[list[str]], *, right_from: int = 1) -> None:
    """A plain data table on stderr (columns from `right_from` on are right-aligned numbers)."""
    t = Table(title=title, title_justify="left", header_style="ui.accent", pad_edge=False)
    for i, h in enumerate(headers):
        t.add_column(h, justify="right" if i >= right_from else "left")
    for r in rows:
        t.add_row(*r)
    con = err()
    if not con.is_terminal:  # a log file: print full width instead of squeezing columns to 80
        con = Console(file=sys.stderr, theme=THEME, highlight=False, width=max(con.width, 220))
    con.print(t)


@contextlib.contextmanager
def progress(total: int, description: str) -> Iterator:
    """A progress bar on stderr; yields `step(label)`, called as each unit of work starts."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err(),
        transient=False,
    )
    task = bar.add_task(description, total=total)
    started = 0

    def step(label: str) -> None:
        nonlocal started
        if started:
            bar.advance(task)
        started += 1
        bar.update(task, description=f"{description}: {label}")

    with bar:
        yield step
        bar.update(task, completed=total, description=description)


@contextlib.contextmanager
def timed_progress(total_s: float, description: str) -> Iterator:
    """A bar over a time budget on stderr; yields `update(label, done_s)`, the label shown beside it.
    Into a log file (not a terminal) a plain line every LOG_EVERY_S instead: a bar would only be
    drawn at the end."""
    import time

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if not err().is_terminal:
        last = [-LOG_EVERY_S]

        def log(label: str, done_s: float) -> None:
            now = time.monotonic()
            if now - last[0] >= LOG_EVERY_S:
                last[0] = now
                info(f"{description} {done_s / 60:.1f}/{total_s / 60:.0f} min: {label}")

        yield log
        return
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[label]}"),
        TimeElapsedColumn(),
        console=err(),
        transient=False,
    )
    task = bar.add_task(description, total=total_s, label="")

    def update(label: str, done_s: float) -> None:
        bar.update(task, completed=min(done_s, total_s), label=label)

    with bar:
        yield update


LOG_EVERY_S = 30.0
