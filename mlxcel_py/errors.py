"""The one user-facing error type and the exit codes it carries.

Anything a user can fix (a flag, a file, a missing model) is an MlxcelError; `terminal.ui.exit_on_error`
(the boundary every command runs inside) prints `MlxcelError.format()` on stderr and exits with its code. Bugs stay ordinary exceptions (tracebacks).
This module imports nothing so every layer can use it.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class MlxcelError(Exception):
    """A failure the user can act on: printed as one line, never as a traceback."""

    def __init__(self, message: str, *, exit_code: int = EXIT_RUNTIME, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.hint = hint

    def __str__(self) -> str:
        return self.message

    def format(self) -> str:
        """What the user reads: `error: MESSAGE`, and `hint: HINT` on a second line where there is one.
        The one spelling of an error line, whoever prints it (a command, a server thread, a rank)."""
        return f"error: {self.message}" + (f"\nhint: {self.hint}" if self.hint else "")


class UsageError(MlxcelError):
    """A bad flag or flag combination (exit code 2, like Click's own usage errors)."""

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message, exit_code=EXIT_USAGE, hint=hint)


class ModelError(MlxcelError):
    """A model path, file or config that cannot be used (exit code 1, before weights load)."""


def exit_on_signal(signum, frame) -> None:
    """A signal handler that exits through Python (finally blocks run) with the shell's code, 128 + signum."""
    raise SystemExit(128 + signum)
