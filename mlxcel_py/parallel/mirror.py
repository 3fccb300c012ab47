"""The leader's forwards mirrored by the followers (distributed.py's module note says why): rank 0's
`Leader` announces each forward's header (sequence, position, token ids) and ticks while idle;
`follow` is a follower's whole life, mirroring those forwards until the leader says stop.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .distributed import (
    _HEAD,
    INLINE,
    MAX_FOLLOWED,
    OP_FORWARD,
    OP_STOP,
    OP_TICK,
    TICK_S,
    DistributedError,
    World,
    guard,
    lost,
    socket_bytes,
)


# ---- the leader's side ------------------------------------------------------------------------
class Leader:
    """Rank 0's channel to the followers: forward headers while busy, ticks while idle."""

    def __init__(self, world: World, tap: Any):
        self.world = world
        self.tap = tap  # models.taps.HiddenTap: the final norm's output, the forward's last collective's result
        self._lock = threading.Condition()
        self._busy = 0
        self._closed = False
        self._seq = 0
        self.failure: BaseException | None = None
        self.rows = 0  # token rows forwarded (prompt, decode steps and verify blocks alike)
        self.last_period: tuple[int, int | None] = (0, None)  # (rows, bytes) of the latest busy stretch
        self._ticker = threading.Thread(target=self._tick_loop, name="mlxcel-ticker", daemon=True)
        self._ticker.start()

    def new_sequence(self) -> int:
        self._seq += 1
        return self._seq

    def _send(self, values: Sequence[int]) -> None:
        import mlx.core as mx

        mx.eval(mx.distributed.all_sum(mx.array(list(values), dtype=mx.int32), group=self.world.group))

    def _header(self, op: int, seq: int = 0, position: int = 0, ids: Sequence[int] = (), code: int = 0) -> list[int]:
        inline = list(ids[:INLINE])
        return [op, seq, position, len(ids), code] + inline + [0] * (INLINE - len(inline))

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Hold the channel for a stretch of forwards (a request, a warmup): no ticks meanwhile."""
        import mlx.core as mx

        with self._lock:
            self._check()
            self._busy += 1
        rows0, bytes0 = self.rows, socket_bytes()
        try:
            yield
        finally:
            try:
                mx.synchronize()  # every announced forward has run before a tick may follow
            except RuntimeError:
                pass
            bytes1 = socket_bytes()
            self.last_period = (self.rows - rows0, None if bytes0 is None or bytes1 is None else bytes1 - bytes0)
            with self._lock:
                self._busy -= 1
                self._lock.notify_all()

    @contextmanager
    def forward(self, seq: int, position: int, x: Any) -> Iterator[Any]:
        """Announce one forward of ids `x` at `position`, yield them as an array for the model
        call, then queue its evaluation up to the final norm. Ctrl-C waits until the forward is
        queued (and so does SIGTERM), so no rank is left inside a forward that another never runs."""
        import mlx.core as mx

        with _deferred_signals():
            mx.eval(x)  # the ids must be known to broadcast them (waits for the step they come from)
            ids = [int(t) for t in x.tolist()]
            with guard(self.world):
                self._send(self._header(OP_FORWARD, seq, position, ids))
                if len(ids) > INLINE:
                    self._send(ids[INLINE:])
            self.rows += len(ids)
            self.tap.last = None
            yield mx.array(ids, dtype=mx.int32)
            if self.tap.last is not None:
                mx.async_eval(self.tap.last)

    def describe_traffic(self) -> str:
        """The latest request's exchange as seen from rank 0's sockets."""
        rows, sent = self.last_period
        if sent is None or not rows:
            return f"{rows} token rows forwarded"
        return f"{sent / 2**10:.1f} KiB over {rows} token rows ({sent / rows / 2**10:.2f} KiB per token)"

    def close(self, code: int = 0) -> None:
        """Tell the followers to exit with `code` (once; quietly if they are gone already)."""
        with self._lock:
            if self._closed:
                return
            # a request still finishing on another thread (a server's worker) goes first
            self._lock.wait_for(lambda: self._busy == 0, timeout=10)
            self._closed = True
            self.world.done = True
            if self.failure is None and not self.world.broken and self._busy == 0:
                try:
                    self._send(self._header(OP_STOP, code=code))
                except RuntimeError:
                    pass

    def _check(self) -> None:
        if self.failure is not None:
            raise lost(self.failure, 0)
        if self._closed:
            raise DistributedError("distributed run stopped: the ranks were already told to stop")

    def _tick_loop(self) -> None:
        while True:
            time.sleep(TICK_S)
            with self._lock:
                if self._closed or self.failure is not None:
                    return
                if self._busy:
                    continue
                try:
                    self._send(self._header(OP_TICK))
                except RuntimeError as exc:
                    self.failure = exc
                    self.world.broken = True
            if self.failure is not None:
                # nobody may be waiting on the engine (chat at its prompt): say so and stop this process
                import sys

                from ..errors import EXIT_RUNTIME

                sys.stderr.write(lost(self.failure, 0).format() + "\n")
                sys.stderr.flush()
                os._exit(EXIT_RUNTIME)


@contextmanager
def _deferred_signals() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM (on the main thread) until the block ends, then deliver them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list = []
    sigs = (signal.SIGINT, signal.SIGTERM)
    old = {s: signal.getsignal(s) for s in sigs}
    try:
        for s in sigs:
            signal.signal(s, lambda n, f: got.append(n))
    except (ValueError, TypeError):
        yield
        return
    try:
        yield
    finally:
        for s in sigs:
            signal.signal(s, old[s])
        for n in got[:1]:
            if callable(old[n]):
                old[n](n, None)
            elif old[n] == signal.SIG_DFL:
                signal.raise_signal(n)


# ---- a follower's side ----------------------------------------------------------------------
def follow(model: Any, world: World, tap: Any) -> int:
    """Mirror the leader's forwards until it says stop; returns the leader's exit code."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from ..cpu import kernels as cpu_kernels
    from ..models import kv_cache

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    caches: dict[int, list] = {}
    g = world.group
    size = _HEAD + INLINE
    with guard(world):
        while True:
            head = mx.distributed.all_sum(mx.zeros((size,), dtype=mx.int32), group=g).tolist()
            op, seq, position, n, code = head[:_HEAD]
            if op == OP_TICK:
                time.sleep(TICK_S)
                continue
            if op == OP_STOP:
                world.done = True
                return code
            if op != OP_FORWARD:
                raise DistributedError(f"rank {world.rank}: unexpected message {op} from rank 0 (mismatched versions?)")
            ids = head[_HEAD : _HEAD + min(n, INLINE)]
            if n > INLINE:
                ids += mx.distributed.all_sum(mx.zeros((n - INLINE,), dtype=mx.int32), group=g).tolist()
            layers = caches.pop(seq, None)
            if layers is None or position == 0:
                layers = make_prompt_cache(model)
                kv_cache.store_caches(model, layers)  # -ctk/-ctv f16, bf16: the leader's rows' type
            caches[seq] = layers  # most recent last
            while len(caches) > MAX_FOLLOWED:
                caches.pop(next(iter(caches)))
            offset = layers[0].offset
            if offset > position:
                for c in layers:
                    c.trim(offset - position)
            elif offset < position:
                raise DistributedError(
                    f"rank {world.rank}: rank 0 continues sequence {seq} at position {position} "
                    f"but this rank holds {offset}"
                )
            with cpu_kernels.engaged(model):
                tap.last = None
                model(mx.array(ids, dtype=mx.int32)[None], cache=layers)
            mx.eval(tap.last)
