"""Where a built-in tool's files and processes live: this host (`HostIO`), or an isolate reached
by a command (`ContainerIO`: `docker|podman exec` into a running container; `SshIO`: a POSIX
host over ssh). Both answer the same questions (resolve a path, stat, read, write, list, run),
so the tools (builtin.py) never know which one they use.

An isolate is driven with POSIX commands only (sh, cat, wc, mkdir, dirname, find, timeout,
git when present), so a busybox image works. File contents travel on stdin, never on a command
line, and each command carries its own `timeout`: killing the host-side client does not stop a
process inside a container.

A runtime comes from the `x-tool-runtime` header or `--tools-runtime`, so it is checked before
anything runs: a container id or ssh target that starts with '-' would be read as an option by
the engine or by ssh (`-oProxyCommand=...` runs a command on this host), and an unknown scheme is
refused rather than silently run on the host (llama-server's rules).
"""

from __future__ import annotations

import codecs
import os
import select
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...options import ToolsRuntimeSpec

# directories a listing reports but never walks into: they can be enormous
JUNK_DIRS = frozenset(
    {".git", ".svn", ".hg", "node_modules", "__pycache__", ".venv", "venv", "dist", "build", "target", ".cache"}
    | {".idea", ".vscode"}
)
LIST_TIMEOUT = 15  # seconds one listing may take (git, or the walk)
LIST_MAX_OUTPUT = 8 << 20
ISOLATE_TIMEOUT = 15  # an isolate's helper commands (stat, cat, mkdir...)
READ_LIMIT = 64 << 20  # no tool loads a longer file (a cut copy could be written back by edit_file)


_running: set[int] = set()  # process groups of the commands running now (stop_all ends them)
_running_lock = threading.Lock()


def stop_all() -> None:
    """The server is shutting down: every tool command still running is killed with its group
    (they run in sessions of their own, so nothing else would end them after the server exits)."""
    with _running_lock:
        groups = list(_running)
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class ToolRuntimeError(Exception):
    """A runtime that cannot be used (a 500 naming it, as llama-server answers)."""


@dataclass
class Ran:
    output: str
    exit_code: int = -1
    timed_out: bool = False
    data: bytes = b""  # the bytes kept, undecoded
    truncated: bool = False  # there was more than max_output


@dataclass
class Listing:
    entries: list[tuple[str, bool]] = field(default_factory=list)  # ('/'-separated path under base, is a dir)
    error: str = ""  # set when base is not a directory
    truncated: bool = False  # the walk could not see everything (time budget, unreadable folder)


def run_process(
    argv: Sequence[str],
    max_output: int,
    timeout: float,
    on_chunk: Callable[[str], bool] | None = None,
    *,
    combine_stderr: bool = True,
    cwd: str | None = None,
    stdin: bytes | None = None,
) -> Ran:
    """Run `argv` (no shell of ours), reading raw output as it comes: at most `max_output` bytes
    are kept (the pipe is drained past that, or the child would block), `on_chunk` gets each
    piece as it arrives (and "" every quarter second without one) and stops the process by
    returning False. The whole process group is killed at `timeout`, so a shell's children go
    too, and by `stop_all` at shutdown."""
    try:
        proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if combine_stderr else subprocess.DEVNULL,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            cwd=cwd or None,
            start_new_session=True,
        )
    except OSError:
        return Ran("failed to spawn process")
    with _running_lock:
        _running.add(proc.pid)
    try:
        return _collect(proc, max_output, timeout, on_chunk, stdin)
    finally:
        with _running_lock:
            _running.discard(proc.pid)


def _collect(
    proc: subprocess.Popen, max_output: int, timeout: float, on_chunk: Callable[[str], bool] | None, stdin
) -> Ran:
    timed_out = threading.Event()
    done = threading.Event()

    def kill() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def watch() -> None:
        if not done.wait(timeout):
            timed_out.set()
            kill()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    if stdin is not None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(stdin)
        except (BrokenPipeError, OSError):  # the exit code says what happened
            pass
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass
    assert proc.stdout is not None
    kept = bytearray()
    truncated = False
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    fd = proc.stdout.fileno()
    while True:
        # a streamed call is asked whether its client is still there between pieces too, so a
        # silent command (a sleep) stops soon after the client leaves, not at its timeout
        if on_chunk is not None and not select.select([fd], [], [], 0.25)[0]:
            if not on_chunk(""):
                kill()
                break
            continue
        try:
            data = os.read(fd, 4096)
        except InterruptedError:
            continue
        if not data:
            break
        if truncated:  # drained, not kept; a streamed call still stops when its client leaves
            if on_chunk is not None and not on_chunk(""):
                kill()
                break
            continue
        room = max_output - len(kept)
        piece = data[:room]
        kept += piece
        if len(data) > room:
            truncated = True
        if on_chunk is not None and piece and not on_chunk(decoder.decode(piece)):
            kill()
            break
    proc.stdout.close()
    code = proc.wait()
    done.set()
    output = kept.decode("utf-8", errors="replace")
    if truncated:
        output += "\n[output truncated]"
    return Ran(output, code, timed_out.is_set(), bytes(kept), truncated)


class ToolIO:
    """What a tool may do, wherever it runs."""

    def resolve(self, path: str) -> str:
        raise NotImplementedError

    def is_dir(self, path: str) -> bool:
        raise NotImplementedError

    def is_file(self, path: str) -> bool:
        raise NotImplementedError

    def size(self, path: str) -> int | None:
        raise NotImplementedError

    def read(self, path: str) -> bytes | None:
        raise NotImplementedError

    def write(self, path: str, content: bytes) -> bool:
        raise NotImplementedError

    def list(self, base: str, max_depth: int, kind: str) -> Listing:
        """Entries under `base` (resolved): kind "file", "dir" or "all"; max_depth 0 is unlimited,
        1 direct children only. Files come from `git ls-files` where base is in a repository
        (so .gitignore holds), else from a walk that skips JUNK_DIRS."""
        raise NotImplementedError

    def run(
        self, argv: Sequence[str], max_output: int, timeout: float, on_chunk: Callable[[str], bool] | None = None
    ) -> Ran:
        raise NotImplementedError

    @property
    def isolated(self) -> bool:
        return False


def _git_files(lines: str, max_depth: int) -> list[str]:
    out = []
    for line in lines.splitlines():
        line = line.rstrip("\r").replace("\\", "/")
        if line and (max_depth <= 0 or line.count("/") + 1 <= max_depth):
            out.append(line)
    return out


class HostIO(ToolIO):
    """This machine, relative paths against `cwd` (the x-tool-cwd header) or the server's own."""

    def __init__(self, cwd: str = ""):
        self.cwd = cwd

    def resolve(self, path: str) -> str:
        p = os.path.expanduser(path) if path.startswith("~") else path
        if not os.path.isabs(p):
            p = os.path.join(self.cwd or os.getcwd(), p)
        return os.path.normpath(p)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(self.resolve(path))

    def is_file(self, path: str) -> bool:
        return os.path.isfile(self.resolve(path))

    def size(self, path: str) -> int | None:
        """A regular file's size (a device such as /dev/zero says 0 and never ends: None)."""
        full = self.resolve(path)
        try:
            return os.path.getsize(full) if os.path.isfile(full) else None
        except OSError:
            return None

    def read(self, path: str) -> bytes | None:
        """A regular file's bytes; None for anything else or a file longer than READ_LIMIT."""
        full = self.resolve(path)
        if not os.path.isfile(full):
            return None
        try:
            with open(full, "rb") as f:
                data = f.read(READ_LIMIT + 1)
        except OSError:
            return None
        return data if len(data) <= READ_LIMIT else None

    def write(self, path: str, content: bytes) -> bool:
        full = self.resolve(path)
        try:
            os.makedirs(os.path.dirname(full) or ".", exist_ok=True)
            with open(full, "wb") as f:
                f.write(content)
        except OSError:
            return False
        return True

    def list(self, base: str, max_depth: int, kind: str) -> Listing:
        if not os.path.isdir(base):
            return Listing(error="path does not exist or is not a directory")
        if kind == "file":
            git = self.run(
                ["git", "-C", base, "ls-files", "--cached", "--others", "--exclude-standard"],
                LIST_MAX_OUTPUT,
                LIST_TIMEOUT,
            )
            if git.exit_code == 0 and not git.timed_out:
                rels = _git_files(git.output, max_depth)
                return Listing([(r, False) for r in rels if os.path.isfile(os.path.join(base, r))])
        return self._walk(base, max_depth, kind)

    def _walk(self, base: str, max_depth: int, kind: str) -> Listing:
        out = Listing()
        deadline = time.monotonic() + LIST_TIMEOUT
        stack = [(base, "", 0)]
        while stack:
            folder, rel, depth = stack.pop()
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError:
                out.truncated = True
                continue
            for entry in entries:
                if time.monotonic() > deadline:
                    out.truncated = True
                    return out
                name = f"{rel}/{entry.name}" if rel else entry.name
                try:
                    is_dir = entry.is_dir()
                    is_file = not is_dir and entry.is_file()
                except OSError:
                    continue
                if is_dir:
                    if kind in ("dir", "all"):
                        out.entries.append((name, True))
                    # junk stays listable, never walked; a link may loop back to an ancestor
                    if entry.name in JUNK_DIRS or entry.is_symlink():
                        continue
                    if max_depth <= 0 or depth + 1 < max_depth:
                        stack.append((entry.path, name, depth + 1))
                elif is_file and kind in ("file", "all"):
                    out.entries.append((name, False))
        return out

    def run(self, argv, max_output, timeout, on_chunk=None) -> Ran:
        return run_process(argv, max_output, timeout, on_chunk, cwd=self.cwd or None)


class IsolateIO(ToolIO):
    """Every operation as a POSIX command in an isolate; `argv` wraps one for its transport."""

    def __init__(self, cwd: str = ""):
        self.cwd = cwd

    @property
    def isolated(self) -> bool:
        return True

    def argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        raise NotImplementedError

    def resolve(self, path: str) -> str:
        if not self.cwd or path.startswith("/"):
            return path
        return f"{self.cwd}/{path}"

    def _exec(self, inner: list[str], max_output: int = 4096, combine_stderr: bool = True) -> Ran:
        return run_process(self.argv(inner, False), max_output, ISOLATE_TIMEOUT, combine_stderr=combine_stderr)

    def _test(self, flag: str, path: str) -> bool:
        r = self._exec(["sh", "-c", f'[ {flag} "$1" ]', "_", self.resolve(path)])
        return r.exit_code == 0 and not r.timed_out

    def is_dir(self, path: str) -> bool:
        return self._test("-d", path)

    def is_file(self, path: str) -> bool:
        return self._test("-f", path)

    def size(self, path: str) -> int | None:
        r = self._exec(["sh", "-c", 'wc -c < "$1"', "_", self.resolve(path)], 64)
        try:
            return int(r.output.strip()) if r.exit_code == 0 and not r.timed_out else None
        except ValueError:
            return None

    def read(self, path: str) -> bytes | None:
        """The file's bytes; None if it cannot be read or is longer than READ_LIMIT (a cut copy
        would let edit_file write the cut file back). stderr is kept out of the bytes."""
        r = self._exec(["cat", "--", self.resolve(path)], READ_LIMIT, combine_stderr=False)
        return r.data if r.exit_code == 0 and not r.timed_out and not r.truncated else None

    def write(self, path: str, content: bytes) -> bool:
        # the content goes on stdin: no command line for the far side to parse, no temporary file here
        inner = ["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "_", self.resolve(path)]
        r = run_process(self.argv(inner, True), 4096, ISOLATE_TIMEOUT, stdin=content)
        return r.exit_code == 0 and not r.timed_out

    def list(self, base: str, max_depth: int, kind: str) -> Listing:
        if not self.is_dir(base):
            return Listing(error="path does not exist or is not a directory")
        if kind == "file":
            git = self._exec(
                ["sh", "-c", 'cd "$1" && git ls-files --cached --others --exclude-standard', "_", base], LIST_MAX_OUTPUT
            )
            if git.exit_code == 0 and not git.timed_out:
                return Listing([(r, False) for r in _git_files(git.output, max_depth)])
        out = Listing()
        for dirs in (True, False):
            if (dirs and kind == "file") or (not dirs and kind == "dir"):
                continue
            prune = " -o ".join(f"-name {n}" for n in sorted(JUNK_DIRS))
            cmd = 'cd "$1" && find . -mindepth 1' + (f" -maxdepth {max_depth}" if max_depth > 0 else "")
            cmd += f" \\( {prune} \\) -prune" + (" -print -o -type d -print" if dirs else " -o -type f -print")
            r = self._exec(["sh", "-c", cmd, "_", base], LIST_MAX_OUTPUT)
            out.truncated |= r.timed_out
            for line in r.output.splitlines():
                line = line.rstrip("\r")
                if line:
                    out.entries.append((line[2:] if line.startswith("./") else line, dirs))
        return out

    def run(self, argv, max_output, timeout, on_chunk=None) -> Ran:
        inner = ["timeout", f"{int(timeout)}s", *argv]
        if self.cwd:  # no transport has a -w for every case: the command changes folder itself
            inner = ["sh", "-c", 'cd "$1" || exit 127; shift; exec "$@"', "_", self.cwd, *inner]
        # a few seconds over, so the isolate's own timeout ends the command cleanly first
        return run_process(self.argv(inner, True), max_output, timeout + 5, on_chunk)


class ContainerIO(IsolateIO):
    """A running docker or podman container (`<engine> exec`)."""

    def __init__(self, engine: str, container: str, cwd: str = ""):
        super().__init__(cwd)
        self.engine, self.container = engine, container

    def argv(self, inner, needs_stdin):
        return [self.engine, "exec", *(["-i"] if needs_stdin else []), self.container, *inner]


class SshIO(IsolateIO):
    """A POSIX host over ssh: remoting, not isolation (the tools can do what that account can).
    Key-based only, with a known host key: there is no console for a prompt."""

    OPTIONS = ("-o", "BatchMode=yes", "-o", "PasswordAuthentication=no")
    OPTIONS += ("-o", "KbdInteractiveAuthentication=no", "-o", "StrictHostKeyChecking=yes")

    def __init__(self, target: str, cwd: str = ""):
        super().__init__(cwd)
        self.target = target

    def argv(self, inner, needs_stdin):
        # the remote shell parses the command line again: one quoted word
        return ["ssh", *self.OPTIONS, *([] if needs_stdin else ["-n"]), self.target, shlex.join(inner)]


def make_io(cwd: str = "", runtime: str = "") -> ToolIO:
    """The IO a call runs on: the host without a runtime, else the running isolate it names
    (options.ToolsRuntimeSpec's rules: never a silent fall back to the host)."""
    if not runtime:
        return HostIO(cwd)
    try:
        spec = ToolsRuntimeSpec.parse(runtime)
    except ValueError as exc:
        raise ToolRuntimeError(str(exc)) from None
    if spec.kind == "image":  # starting one belongs to --tools-runtime (runtime.py); a call only attaches
        raise ToolRuntimeError(f"tool runtime must name a running container: {runtime}")
    if spec.kind == "container":
        return ContainerIO(spec.engine, spec.target, cwd)
    return SshIO(spec.target, cwd)
