"""Typer reads a command's options from its function's signature: commands built from the shared
parameter lists (`_options`) get theirs here."""

from __future__ import annotations

import inspect


def with_params(params: list[inspect.Parameter]):
    """Give a `def cmd(**params)` function the signature Typer reads its options from."""

    def deco(fn):
        fn.__signature__ = inspect.Signature(params)
        return fn

    return deco
