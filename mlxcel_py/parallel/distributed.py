"""One model across several processes, on MLX's own distributed engine (ring, MPI...).

Layout. `--tp-size N` shards every attention and MLP layer along mlx-lm's `model.shard(group)`
(each rank holds 1/N of the heads and of the feed-forward width). On the CPU kernels every linear
is split by its outputs and the ranks' rows are joined by copying, so the bits are one process's
(`exact_tp`); elsewhere mlx-lm's split stands, its row-parallel halves added by an all-sum.
`--pp-size N` gives each rank a contiguous run of layers: mlx-lm's `PipelineMixin` where the
architecture has it, `pipeline_stages` for llama-style models it lacks. Each rank holds the
caches of its own part only.

Who decides (`mirror`: the Leader and `follow`). Rank 0, the leader, runs the whole engine (drafters, verify rounds, sampling, stop
strings, the terminal or HTTP face). The other ranks, followers, run no engine: they mirror the
leader's forwards. Before each forward the leader broadcasts a header over the same group
(which sequence, the position its caches stand at, the token ids); a follower trims its caches
to that position (a rejected draft, a reused prompt prefix) and runs the same forward. Only token
ids cross ranks, never text or sampling state, and the logits that decide are rank 0's.

Every announced forward is evaluated on every rank up to the final norm (the point after the
last collective), in announcement order, so the ranks' collectives always pair up; the leader
evaluates the logits on top. Only caches that a trim rolls back are allowed (`why_not_model`).

Idle. A rank waiting inside a ring collective spins a core. While the leader has nothing to run
(chat waiting for input, a server without requests) a ticker thread on the leader and every
follower meet each TICK_S seconds with a no-op header and sleep in between, so an idle rank
costs nothing and new work waits at most one tick.

Failures. A rank that dies closes its sockets and the ring fails the others' pending collectives
with a RuntimeError. Whether a RuntimeError means that is decided by the run's own connections,
not by the error's text: the TCP sockets that joining the group opened (`World.links`) are asked
for their state, and one that is no longer established means a rank went away; `lost()` turns
that into a one-line error (exit 1). Any other RuntimeError is a bug and keeps its traceback.
Followers ignore SIGINT: Ctrl-C belongs to the leader's terminal, and the leader tells them when
to stop.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import EXIT_USAGE, MlxcelError
from ..options import ParallelOptions as Layout  # --tp-size / --pp-size

if TYPE_CHECKING:
    from .mirror import Leader

TICK_S = 0.05
WATCH_S = 2.0  # a closed link this long with the rank still here: end it (`_watch`)
INLINE = 16  # token ids carried in the header itself (a decode step or a verify block)
_HEAD = 5  # op, sequence, position, count, exit code
OP_TICK, OP_FORWARD, OP_STOP = 1, 2, 3
MAX_FOLLOWED = 8  # sequences a follower keeps caches for (the leader's scratch caches come and go)
_LAUNCH_ENV = ("MLX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


@dataclass
class World:
    group: Any
    rank: int
    size: int
    layout: Layout
    backend: str
    channel: Leader | None = None  # on rank 0 once the engine is built
    broken: bool = False  # a collective failed: the ring is gone, and a further send would hang
    links: dict = field(default_factory=dict)  # fd -> inode of the sockets joining the group opened
    done: bool = False  # the run's end was sent or received: closed links are expected from here

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def why_not_exact(self, model: Any) -> str | None:
        """Why `model`'s tensor-parallel split cannot be the exact one (`exact_tp`), or None."""
        from . import exact_tp

        return exact_tp.why_not(model, self.layout.tp_size)

    def take_part(self, model: Any, exact: bool = False) -> None:
        """Keep this rank's part of `model`'s (lazy) weights and read only that part (`exact`:
        tensor-parallel layers split by outputs, `exact_tp`)."""
        import mlx.core as mx

        shard(model, self, exact)
        with guard(self):
            mx.eval(model.parameters())


class DistributedError(MlxcelError):
    pass


def lost(exc: BaseException, rank: int | None = None) -> DistributedError:
    first = (str(exc).splitlines() or [type(exc).__name__])[0]
    who = f"rank {rank}" if rank is not None else "this rank"
    return DistributedError(
        f"distributed run stopped: {who} lost contact with another rank ({first})",
        hint="a rank exited or was killed; see its own error above, then start every rank again",
    )


def _sockets() -> dict[int, int] | None:
    """fd -> inode of this process's sockets (Linux /proc; None where there is none)."""
    out = {}
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            st = os.stat(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if stat.S_ISSOCK(st.st_mode):
            out[int(fd)] = st.st_ino
    return out


def _tcp_info(fd: int, size: int) -> bytes | None:
    """TCP_INFO of a TCP socket (read through a duplicate, so `fd` stays as it is); None for any
    other socket, or when it cannot be read."""
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    try:
        if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, size)
    except OSError:
        return None
    finally:
        s.close()


_TCP_ESTABLISHED = 1  # tcp_info.tcpi_state (linux/tcp_states.h)


def links_down(world: World | None) -> bool:
    """Whether one of the group's own connections was closed (a rank went away)."""
    return world is not None and _any_down(world.links)


def _established(fd: int) -> bool:
    info = _tcp_info(fd, 8)
    return info is not None and info[0] == _TCP_ESTABLISHED


def _any_down(links: dict[int, int]) -> bool:
    """Whether one of `links` (fd -> inode) is closed (and maybe reused) or no longer established."""
    now = _sockets() or {}
    return any(now.get(fd) != inode or not _established(fd) for fd, inode in links.items())


def is_lost_contact(exc: BaseException, world: World | None) -> bool:
    """A failed collective of this run: a RuntimeError while one of its connections is down."""
    return isinstance(exc, RuntimeError) and links_down(world)


@contextmanager
def guard(world: World | None) -> Iterator[None]:
    """Turn a failed collective (a rank went away) into the one-line error."""
    try:
        yield
    except RuntimeError as exc:
        if not is_lost_contact(exc, world):
            raise
        world.broken = True
        raise lost(exc, world.rank) from None


# ---- joining ------------------------------------------------------------------------------------
def launched() -> bool:
    return any(k in os.environ for k in _LAUNCH_ENV)


def join(layout: Layout) -> World | None:
    """Connect to the other ranks (blocks until every rank has started); None for one process."""
    if not layout.active:
        return None
    import mlx.core as mx

    start = f"mlxcel launch -n {layout.size} -- mlxcel ... {layout.flag}"
    if not mx.distributed.is_available():
        raise DistributedError(
            f"{layout.flag}: this MLX build has no distributed backend",
            hint="install an mlx wheel with the ring backend (the pinned mlx[cpu] has it)",
        )
    if not launched():
        raise DistributedError(
            f"{layout.flag} needs {layout.size} processes started together, one per rank",
            exit_code=EXIT_USAGE,
            hint=f"start it with `{start}` (or mlx.launch -n {layout.size})",
        )
    before = _sockets() or {}
    try:
        group = mx.distributed.init(strict=True)
    except RuntimeError as exc:
        raise DistributedError(
            f"{layout.flag}: cannot join the distributed group ({str(exc).splitlines()[0]})",
            hint=f"start it with `{start}`",
        ) from None
    if group.size() != layout.size:
        raise DistributedError(
            f"{layout.flag} needs a world of {layout.size} ranks, but this launch started {group.size()}",
            exit_code=EXIT_USAGE,
            hint=f"launch {layout.size} ranks, or set the size to {group.size()}",
        )
    backend = "ring" if "MLX_HOSTFILE" in os.environ or "MLX_RING_HOSTS" in os.environ else "mpi"
    # the group's own TCP connections (links_down reads their state)
    links = {fd: ino for fd, ino in (_sockets() or {}).items() if before.get(fd) != ino and _tcp_info(fd, 8)}
    world = World(group, group.rank(), group.size(), layout, backend, links=links)
    _watch(world)
    return world


def _watch(world: World) -> None:
    """End this rank with the lost-contact error when a connection of the group that was up at
    the join has been down for WATCH_S and the rank is still here. A collective that a dead peer
    fails normally raises (`guard`), but MLX's ring can also leave one waiting forever on the
    dead peer (seen with several collectives queued in one forward, on either rank): then nothing
    else would end it. Only connections established at the join count: the ring also leaves
    sockets of its connection attempts open, never connected."""
    up = {fd: ino for fd, ino in world.links.items() if _established(fd)}

    def loop() -> None:
        since = None
        while not world.done:
            time.sleep(WATCH_S / 4)
            if world.done or not _any_down(up):
                since = None
                continue
            since = since or time.monotonic()
            if time.monotonic() - since >= WATCH_S:
                import sys

                from ..errors import EXIT_RUNTIME

                gone = RuntimeError("a connection of the group closed while this rank waited on it")
                sys.stderr.write(lost(gone, world.rank).format() + "\n")
                sys.stderr.flush()
                os._exit(EXIT_RUNTIME)

    threading.Thread(target=loop, name="mlxcel-watch", daemon=True).start()


# ---- what a model needs ------------------------------------------------------------------------
def why_not_model(config: dict, layout: Layout) -> str | None:
    """Why this model cannot run in `layout`, from its config and a weightless instance (before
    any weight loads), or None."""
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import _get_classes

    from ..models.cache_kinds import Trim, adapter_for, leaves
    from . import pipeline_stages

    kind = config.get("model_type", "?")
    try:
        model_cls, args_cls = _get_classes(config)
        model = model_cls(args_cls.from_dict(config))
    except Exception as exc:  # load() reports it in its own words
        return f"model_type {kind} cannot be built ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
    if layout.tp_size > 1:
        if not hasattr(model, "shard"):
            return f"model_type {kind} has no tensor-parallel sharding in mlx-lm (llama, qwen2, qwen3, qwen3_5, deepseek... have it)"
        args = getattr(model, "args", None)
        for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
            n = config.get(name, getattr(args, name, None))
            if isinstance(n, int) and n % layout.tp_size:
                return f"its {name} ({n}) does not divide by --tp-size {layout.tp_size}"
    if layout.pp_size > 1:
        inner = getattr(model, "model", None)
        if not (hasattr(inner, "pipeline") or pipeline_stages.supports(model)):
            return (
                f"model_type {kind} has no pipeline stages (mlx-lm's pipeline models, e.g. qwen2, qwen3_moe, "
                f"qwen3_5, deepseek, and llama-style models have them)"
            )
        layers = len(getattr(inner, "layers", []))
        if layers < layout.pp_size:
            return f"it has {layers} layers, fewer than --pp-size {layout.pp_size} stages"
    kinds = {type(c).__name__ for c in leaves(make_prompt_cache(model)) if adapter_for(c) is not Trim}
    if kinds:
        return (
            f"its {', '.join(sorted(kinds))} caches cannot be rolled back by a trim on every rank "
            f"(distributed runs need plain KV caches)"
        )
    return None


def shard(model: Any, world: World, exact: bool = False) -> None:
    """Give this rank its part of `model` (weights may still be lazy: only that part is read)."""
    from . import exact_tp, pipeline_stages

    if world.layout.tp_size > 1:
        if not exact:
            model.shard(world.group)
        elif why := exact_tp.shard(model, world.group):  # exact_tp.why_not said it would work
            raise RuntimeError(f"exact tensor-parallel split failed: {why}")
    elif hasattr(model.model, "pipeline"):
        model.model.pipeline(world.group)
    else:
        pipeline_stages.split(model, world.group)


def barrier(world: World) -> None:
    import mlx.core as mx

    with guard(world):
        mx.eval(mx.distributed.all_sum(mx.array(1), group=world.group))


def socket_bytes() -> int | None:
    """Bytes sent plus received on this process's TCP sockets (the ring's), from TCP_INFO."""
    fds = _sockets()
    if fds is None:
        return None
    total = 0
    for fd in fds:
        info = _tcp_info(fd, 256)
        if info is not None and len(info) >= 136:  # tcpi_bytes_acked, tcpi_bytes_received (Linux 4.1+)
            acked, received = struct.unpack_from("QQ", info, 120)
            total += acked + received
    return total
