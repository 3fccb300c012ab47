"""`serve --sleep-idle-seconds N`: after N seconds with no request the model lets go of its
weights, its drafters and every cache; the next request that needs the model loads it again
(llama-server's sleep mode).

Both moves run on the worker thread, the only one that runs MLX, between jobs: a request queued
as the server falls asleep is simply the one that wakes it. (llama-server's handlers check
"awake" and then queue, so a request that lands in between can sit unanswered or read a freed
vocabulary.) What the routes read on their own threads stays: the tokenizer and its template,
and the engine object with what /props reports (window, drafter configuration, end-of-sequence
ids). Only the engine's weights and drafters are swapped, by `Engine.release` and `Engine.adopt`,
so every reference to the engine stays good.

Loading again is the same `open_session` the server started with: the same files, flags and
drafter, then the same warmup, so a reply after waking is the reply the server gave before.
"""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any


class Resident:
    """The loaded session behind a server: released after `idle_seconds`, loaded on demand."""

    def __init__(
        self,
        session: Any,
        load: Callable[[], Any],
        idle_seconds: float,
        *,
        warmup: bool = True,
        say: Callable[[str], None] = lambda s: None,
    ):
        self.session = session
        self.engine = session.engine  # the object the routes and the worker hold, for good
        self.load = load
        self.idle_seconds = idle_seconds
        self.warmup = warmup
        self.say = say
        self.sleeps = 0  # times it fell asleep (and woke: `wakes`), for the log and tests
        self.wakes = 0
        self.asleep = False  # set once everything is released; cleared once loaded and warm again
        self.held = False  # the last release left the model referenced (its memory was not freed)

    def release(self) -> None:
        """Save what the drafter keeps across runs, then drop weights and caches."""
        try:  # a store that cannot be written costs its memory of this run, not the sleep
            said = self.session.save_store() if self.session is not None else None
        except Exception as exc:
            said = f"sleeping: the drafter's store was not saved ({type(exc).__name__}: {exc})"
        if said:
            self.say(said)
        before = _rss_mib()
        weights = weakref.ref(self.engine.model)
        self.engine.release()
        self.session = None
        gc.collect()  # the model's modules hold reference cycles: free them now, not at some later pass
        import mlx.core as mx

        mx.clear_cache()
        _trim_heap()
        self.sleeps += 1
        self.asleep = True  # once the memory is back (/props says is_sleeping from here on)
        self.held = weights() is not None  # something still holds the model: a bug, said below
        line = f"sleeping: model released after {self.idle_seconds:g} s idle (--sleep-idle-seconds)"
        if before is not None and (after := _rss_mib()) is not None:
            line += f"; resident memory {before:,} -> {after:,} MiB"
        if self.held:
            line += "; but the weights are still referenced, so their memory was not freed (please report this)"
        self.say(line)

    def restore(self) -> None:
        """Load the model again (the same files and flags) and warm it as at startup."""
        start = time.perf_counter()
        fresh = self.load()
        self.engine.adopt(fresh.engine)
        self.session = replace(fresh, engine=self.engine)
        if self.warmup:
            self.engine.warmup()
        self.wakes += 1
        self.asleep = False
        self.say(f"awake: model loaded again in {time.perf_counter() - start:.2f} s")


def _trim_heap() -> None:
    """Hand the freed heap back to the system (glibc keeps freed blocks for reuse, so the
    process's resident size would not show the release); a no-op where there is no glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _rss_mib() -> int | None:
    """This process's resident memory (Linux), for the sleep line."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS"))
    except (OSError, StopIteration, ValueError):
        return None
