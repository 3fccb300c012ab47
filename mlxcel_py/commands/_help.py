"""`--help` laid out by click, in the option groups (`rich_help_panel`) the aliases declare.

Typer's rich panels cut long option names with an ellipsis when the terminal is narrow
(`--prompt-lookup-ngram…` at 80 columns). Click's layout never truncates: a name too long for its
column puts the help on the next line. The groups stay as titled sections.
"""

from __future__ import annotations

from typing import Any

import typer.core


class GroupedHelpCommand(typer.core.TyperCommand):
    def format_help(self, ctx: Any, formatter: Any) -> None:
        self.rich_markup_mode = None  # typer then uses its click layout
        super().format_help(ctx, formatter)

    def format_options(self, ctx: Any, formatter: Any) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                record = (_plain_metavar(record[0], param), record[1])
                title = getattr(param, "rich_help_panel", None) or "Options"
                sections.setdefault(title, []).append(record)
        for title, rows in sections.items():
            with formatter.section(title):
                formatter.write_dl(rows)


# typer's click layout spells metavars as Python types; say what to type instead
_METAVARS = {" <list[str]>": " TEXT", " <str>": " TEXT", " <int>": " INT", " <float>": " FLOAT", " <path>": " PATH"}


def _plain_metavar(names: str, param: Any) -> str:
    if getattr(param, "param_type_name", "") == "argument":
        return names.split(" ")[0]
    for python, plain in _METAVARS.items():
        if names.endswith(python):
            return names[: -len(python)] + plain
    return names
