"""serve's flags that shape how the server holds its models: --sleep-idle-seconds (release the
model when idle) and router mode (--models-dir, --models-max), checked by validate before anything
loads (docs/validation.md)."""

from __future__ import annotations

from .errors import UsageError
from .options import CommandOptions


def check(opts: CommandOptions) -> None:
    _sleep(opts)
    _router(opts)


def _sleep(opts: CommandOptions) -> None:
    srv = opts.server
    if srv.sleep_idle_seconds == 0 or srv.sleep_idle_seconds < -1:
        raise UsageError(f"--sleep-idle-seconds must be -1 (never) or 1 or more seconds, got {srv.sleep_idle_seconds}")
    if srv.sleep_idle_seconds > 0 and opts.parallel.active:
        raise UsageError(
            f"--sleep-idle-seconds does not run under {opts.parallel.flag}: every rank holds its part of the model; "
            "drop one of them"
        )


def _router(opts: CommandOptions) -> None:
    """--models-dir (router mode) against what names one model or splits one (the folder's
    existence is checked with the other folders, in validate)."""
    srv = opts.server
    if srv.models_max < 0:
        raise UsageError(f"--models-max must be 0 (no limit) or more, got {srv.models_max}")
    if srv.models_dir is None:
        return
    if opts.model.model is not None:
        raise UsageError("--models-dir runs a router that starts one server per model found there; drop -m/--model")
    if opts.parallel.active:
        raise UsageError(f"--models-dir does not run under {opts.parallel.flag}; drop one of them")
