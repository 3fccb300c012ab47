"""llama.cpp's flag spelling: its parser reads a long flag's underscores as dashes (`--ctx_size`
is `--ctx-size`, `--backend_sampling` is `--backend-sampling`), and scripts written for
llama-server use both. A command here takes both too, for the flags it has: an argument is
respelled only when its dashed name is one of the command's long flags and the underscored one
is not, so a value that happens to start with "--" is left alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def long_flags(command: Any) -> set[str]:
    """A Typer command's long flag names (both of a --x/--no-x pair)."""
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}


def respell(args: Sequence[str], flags: set[str]) -> list[str]:
    out = []
    for arg in args:
        name, eq, value = arg.partition("=")
        if arg.startswith("--") and "_" in name and name not in flags and name.replace("_", "-") in flags:
            arg = name.replace("_", "-") + eq + value
        out.append(arg)
    return out
