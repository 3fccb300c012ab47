"""A command's distributed side: join the other ranks; a follower loads its part of the model
and mirrors rank 0 until rank 0 stops (no terminal, no HTTP); rank 0 carries on as usual and
tells the followers to stop when it ends, with its own exit code."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer

from ..errors import EXIT_INTERRUPTED, EXIT_RUNTIME, MlxcelError, exit_on_signal
from ..options import RunConfig


@contextmanager
def ranks(run: RunConfig) -> Iterator[Any]:
    """Yields the distributed.World on rank 0 (None for one process); never yields on followers."""
    from ..parallel import distributed

    world = distributed.join(run.options.parallel)
    if world is None:
        yield None
        return
    if not world.leader:
        raise typer.Exit(follow(run, world))
    code = EXIT_RUNTIME
    # SIGTERM's default would end rank 0 without a word to the others (they would report a lost
    # rank): exit through Python instead, so the followers are told to stop (serve has its own)
    signal.signal(signal.SIGTERM, exit_on_signal)
    try:
        with distributed.guard(world):
            yield world
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else EXIT_RUNTIME
        raise
    except typer.Exit as exc:
        code = exc.exit_code
        raise
    except MlxcelError as exc:
        code = exc.exit_code
        raise
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
        raise
    finally:
        if world.channel is not None:
            world.channel.close(code)


def follow(run: RunConfig, world: Any) -> int:
    from ..parallel import mirror
    from ..session import open_follower

    session = open_follower(run, world)
    return mirror.follow(session.target.model, world, session.tap)
