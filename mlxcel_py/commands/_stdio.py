"""The process's standard streams, made usable before anything else runs (every entry point)."""

from __future__ import annotations

import os
import sys


def std_streams() -> None:
    """Give closed standard descriptors /dev/null (daemons and `subprocess` callers start us with
    fd 0 closed, `cmd <&-`): else the first file opened later (a model's weights) becomes fd 0,
    and Python's sys.stdin is None, which code reading a prompt does not expect."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            got = os.open(os.devnull, os.O_RDWR)
            if got != fd:  # a lower descriptor was closed too and took it first: move it
                os.dup2(got, fd)
                os.close(got)
    if sys.stdin is None:
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's own stdin, kept open)
    # invalid UTF-8 on stdin reaches the prompt readers as surrogates (commands/_input.py replaces
    # them) instead of a UnicodeDecodeError out of the read
    if hasattr(sys.stdin, "reconfigure"):
        sys.stdin.reconfigure(errors="surrogateescape")
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
