"""`mlxcel launch`: start the ranks of a distributed run and keep them together.

It does what `mlx.launch` does for the ring backend (one rank per host of an MLX hostfile, or N
local ranks on the loopback; `MLX_RANK` and a ring hostfile of ip:port per rank in each rank's
environment), and the three things a terminal user needs that `mlx.launch` lacks:

- rank 0 owns the terminal: its stdin, stdout and stderr are this process's, so `chat` reads the
  keyboard and `generate` pipes its output. The other ranks get no stdin, start in their own
  session (Ctrl-C reaches rank 0 only, which tells them to stop) and their stderr lines come out
  prefixed `[rank N]`.
- no hung ranks: when any rank exits with an error, the others get a few seconds to notice (the
  ring fails their collectives) and are then terminated; the exit code is rank 0's, or 1.
- SIGTERM to the launcher goes to rank 0, which stops as it would alone and tells the others;
  whatever is still running after the grace is terminated.
- local ranks split this machine's cores (OPENBLAS_NUM_THREADS unless set): a rank waiting
  in a ring collective spins a core, so 2 ranks x 2 BLAS threads on 2 cores ran 5x slower.

Remote ranks run through `ssh HOST` (key-based, no prompts), in the same working directory if it
exists there, with `mlxcel` on their PATH. A remote rank whose ring breaks exits by itself.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import MlxcelError, UsageError

DEFAULT_PORT = 32323  # mlx.launch's default starting port for the ring
GRACE_S = 5.0  # how long the other ranks get to stop by themselves once one has ended
_LOCAL = {"localhost", "127.0.0.1", "::1"}
_NOISE = "was closed by the peer"  # the ring's per-socket lines when a rank dies; one is enough


@dataclass(frozen=True)
class Host:
    ssh: str
    ips: tuple[str, ...]

    @property
    def local(self) -> bool:
        return self.ssh in _LOCAL or self.ssh == socket.gethostname()


def read_hostfile(path: str) -> tuple[list[Host], list[str]]:
    """An MLX hostfile: a JSON list of {"ssh": NAME, "ips": [IP, ...]}, or {"hosts": [...], "envs": [...]}."""
    p = Path(path).expanduser()
    try:
        data = json.loads(p.read_text())
    except OSError as exc:
        raise UsageError(f"--hostfile {path}: cannot read it ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"--hostfile {path}: not JSON ({exc})") from None
    envs: list[str] = []
    if isinstance(data, dict):
        envs = [str(e) for e in data.get("envs", [])]
        data = data.get("hosts")
    if not isinstance(data, list) or not data:
        raise UsageError(
            f"--hostfile {path}: expected a list of hosts like "
            '[{"ssh": "host1", "ips": ["10.0.0.1"]}, {"ssh": "host2", "ips": ["10.0.0.2"]}]'
        )
    hosts = []
    for i, h in enumerate(data):
        if not isinstance(h, dict) or not isinstance(h.get("ssh"), str):
            raise UsageError(f'--hostfile {path}: host {i} has no "ssh" name')
        ips = h.get("ips") or []
        if not ips or not all(isinstance(ip, str) for ip in ips):
            raise UsageError(
                f'--hostfile {path}: host {i} ({h["ssh"]}) lists no "ips"; the ring connects to '
                f"IP addresses (its Ethernet or Thunderbolt address)"
            )
        hosts.append(Host(h["ssh"], tuple(ips)))
    return hosts, envs


def ring_hostfile(hosts: Sequence[Host], port: int) -> str:
    """The ring backend's own hostfile: per rank, the ip:port it listens on (one port per rank)."""
    ring = []
    for h in hosts:
        ring.append([f"{h.ips[0]}:{port}"])
        port += 1
    return json.dumps(ring)


def layout_size(args: Sequence[str]) -> int | None:
    """The world size the command asks for (--tp-size / --pp-size), or None if it asks for neither."""
    sizes = []
    for i, a in enumerate(args):
        for flag in ("--tp-size", "--pp-size"):
            value = (
                a[len(flag) + 1 :]
                if a.startswith(flag + "=")
                else (args[i + 1] if a == flag and i + 1 < len(args) else None)
            )
            if value is not None:
                try:
                    sizes.append(int(value))
                except ValueError:
                    return None  # the command's own parser says what is wrong with it
    sizes = [s for s in sizes if s > 1]
    return sizes[0] if sizes else None


def _command(args: Sequence[str]) -> list[str]:
    rest = list(args)
    if rest and Path(rest[0]).name in ("mlxcel", "mlxcel-server"):
        rest = rest[1:] if Path(rest[0]).name == "mlxcel" else ["serve"] + rest[1:]
    if not rest:
        raise UsageError(
            "mlxcel launch: give the command to run after --, e.g. "
            "mlxcel launch -n 2 -- mlxcel generate -p 'Hello' --tp-size 2"
        )
    return rest


def _pump(rank: int, stream, out) -> None:
    """Copy a follower's stderr lines to ours with its rank in front (the ring's repeated
    per-socket lines once)."""
    noisy = False
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        if _NOISE in line:
            if noisy:
                continue
            noisy = True
        out.write(f"[rank {rank}] {line}\n")
        out.flush()


def launch(args: Sequence[str], *, n: int | None, hostfile: str | None, port: int, verbose: bool = False) -> int:
    command = _command(args)
    envs: list[str] = []
    if hostfile is not None:
        hosts, envs = read_hostfile(hostfile)
        if n is not None and n != len(hosts):
            raise UsageError(f"-n {n} does not match the {len(hosts)} hosts of --hostfile {hostfile}; drop -n")
    else:
        if n is None or n < 2:
            raise UsageError("mlxcel launch needs -n N (at least 2 local ranks) or --hostfile FILE")
        hosts = [Host("127.0.0.1", ("127.0.0.1",))] * n
    if not 1024 <= port <= 65535 - (len(hosts) - 1):
        raise UsageError(
            f"--starting-port {port}: rank r listens on PORT + r, so it must be between 1024 and "
            f"{65535 - (len(hosts) - 1)}"
        )
    size = layout_size(command)
    if size is None:
        raise UsageError(
            f"mlxcel launch: the command gives neither --tp-size {len(hosts)} nor --pp-size "
            f"{len(hosts)}, so every rank would run the whole model alone; add one"
        )
    if size != len(hosts):
        raise UsageError(f"the command asks for {size} ranks but the launch starts {len(hosts)}; make them equal")
    ring = ring_hostfile(hosts, port)
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    tmp = tempfile.NamedTemporaryFile("w", prefix="mlxcel-ring-", suffix=".json", delete=False)
    tmp.write(ring)
    tmp.close()
    local = sum(h.local for h in hosts)
    threads = str(max(1, (os.cpu_count() or 1) // max(local, 1)))
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C is rank 0's
    stop = threading.Event()
    old_term = signal.signal(signal.SIGTERM, lambda s, f: stop.set())
    try:
        for rank, host in enumerate(hosts):
            env = dict(os.environ)
            env.update(e.split("=", 1) for e in envs if "=" in e)
            env.update(MLX_RANK=str(rank), MLX_HOSTFILE=tmp.name)
            if host.local:
                # ranks sharing this machine share its cores: a rank waiting in the ring spins,
                # so more BLAS threads than cores/ranks make every step wait on a busy core
                for var in ("OPENBLAS_NUM_THREADS", "MLXCEL_KERNEL_THREADS"):
                    env.setdefault(var, threads)
                argv = [sys.executable, "-m", "mlxcel_py", *command]
            else:
                remote = (
                    f"cd {shlex.quote(os.getcwd())} 2>/dev/null; f=$(mktemp); printf %s {shlex.quote(ring)} > $f; "
                    + " ".join(f"export {shlex.quote(e)};" for e in envs if "=" in e)
                    + f" MLX_RANK={rank} MLX_HOSTFILE=$f exec mlxcel {shlex.join(command)}"
                )
                argv = ["ssh", "-o", "BatchMode=yes", host.ssh, remote]
            if verbose:
                sys.stderr.write(
                    f"[launch] rank {rank} on {host.ssh} ({host.ips[0]}:{port + rank}): {shlex.join(argv)}\n"
                )
            if rank == 0:  # SIGINT back to the default, so its Python turns Ctrl-C into KeyboardInterrupt
                procs.append(subprocess.Popen(argv, env=env, preexec_fn=_default_sigint))
            else:
                p = subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
                procs.append(p)
                t = threading.Thread(target=_pump, args=(rank, p.stderr, sys.stderr), daemon=True)
                t.start()
                pumps.append(t)
        return _supervise(procs, stop)
    except OSError as exc:
        raise MlxcelError(f"mlxcel launch: cannot start a rank ({exc.strerror or exc})") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for t in pumps:
            t.join(timeout=1)
        os.unlink(tmp.name)
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _supervise(procs: list[subprocess.Popen], stop: threading.Event) -> int:
    ended_at: float | None = None
    failed: tuple[int, int] | None = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            break
        if stop.is_set():  # SIGTERM: rank 0 stops the way it stops alone and tells the others
            if procs[0].poll() is None:
                procs[0].terminate()
            stop.clear()
            ended_at = ended_at or time.monotonic()
        for rank, c in enumerate(codes):
            if c is not None and ended_at is None:
                ended_at = time.monotonic()
                if c != 0:
                    failed = (rank, c)
                    sys.stderr.write(f"[launch] rank {rank} exited with code {c}; stopping the other ranks\n")
        if ended_at is not None and time.monotonic() - ended_at > GRACE_S:
            for rank, p in enumerate(procs):
                if p.poll() is None:
                    sys.stderr.write(f"[launch] rank {rank} did not stop by itself; terminating it\n")
                    p.terminate()
            try:
                for p in procs:
                    p.wait(timeout=3)
            except subprocess.TimeoutExpired:
                pass
            break
        time.sleep(0.05)
    codes = [p.poll() for p in procs]
    first = codes[0]
    if first is not None and first != 0:
        return first if first > 0 else 128 - first
    if failed is not None or any(c not in (0, None) for c in codes):
        return 1
    return 0
