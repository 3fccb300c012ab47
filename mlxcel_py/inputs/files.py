"""Reading a file the user named (a flag's FILE), with a bound on its size and on the wait.

`Path.read_text()` reads whatever is there: `--config /dev/zero` grew to 4.5 GB in 8 s, and a
FIFO nobody writes to hung the command. Here a regular file's size is checked before reading; a
pipe, FIFO or device (`<(cmd)` process substitution stays useful) is read as it comes, at most
`limit` bytes, and a silence of `wait` seconds with nothing read ends it. Callers turn
`UnreadableFile` into their own error naming the flag (layer 0: no error type of ours here).
"""

from __future__ import annotations

import os
import select
import stat
import time
from pathlib import Path

MIB = 2**20
# seconds a pipe or FIFO may stay silent before its read is given up (MLXCEL_FILE_WAIT)
WAIT_S = float(os.environ.get("MLXCEL_FILE_WAIT", "10"))


class UnreadableFile(Exception):
    """Why a file could not be read, as the end of a sentence that starts with its flag and path."""


def read_bytes(path: str | Path, limit: int, *, wait: float = WAIT_S) -> bytes:
    """The file's bytes; UnreadableFile if it is missing, a folder, unreadable, over `limit`
    bytes, or a pipe that stays silent `wait` seconds."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except FileNotFoundError:
        raise UnreadableFile("no such file") from None
    except OSError as exc:  # a symlink loop, a path through a file, no permission on a folder
        raise UnreadableFile(f"cannot read it ({exc.strerror or exc})") from None
    if stat.S_ISDIR(st.st_mode):
        raise UnreadableFile("is a folder, not a file")
    if stat.S_ISREG(st.st_mode) and st.st_size > limit:
        raise UnreadableFile(f"is {st.st_size} bytes; the limit is {limit}")
    try:
        fd = os.open(p, os.O_RDONLY | (0 if stat.S_ISREG(st.st_mode) else os.O_NONBLOCK))
    except OSError as exc:
        raise UnreadableFile(f"cannot read it ({exc.strerror or exc})") from None
    try:
        if stat.S_ISREG(st.st_mode):
            data = _read_regular(fd, limit)
        else:
            data = _read_stream(fd, limit, wait, fifo=stat.S_ISFIFO(st.st_mode))
    except OSError as exc:
        raise UnreadableFile(f"cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UnreadableFile(f"holds more than {limit} bytes (the limit)")
    return data


def read_text(path: str | Path, limit: int, *, wait: float = WAIT_S) -> str:
    """`read_bytes` as UTF-8 text; UnreadableFile if it is not UTF-8."""
    try:
        return read_bytes(path, limit, wait=wait).decode("utf-8")
    except UnicodeDecodeError:
        raise UnreadableFile("is not UTF-8 text") from None


def _read_regular(fd: int, limit: int) -> bytes:
    chunks, total = [], 0
    while total <= limit:  # the file may grow while it is read
        chunk = os.read(fd, min(MIB, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def _read_stream(fd: int, limit: int, wait: float, *, fifo: bool) -> bytes:
    """A pipe, FIFO or device, opened non-blocking: read until its end or `limit` + 1 bytes. A FIFO
    with no writer reads as ended at once, so there an end before any byte is waited out (a writer
    may still open it) until `wait` seconds have passed; a device's end is its end (/dev/null)."""
    chunks, total = [], 0
    quiet_since = time.monotonic()
    while total <= limit:
        left = wait - (time.monotonic() - quiet_since)
        if left <= 0:
            raise UnreadableFile(f"nothing arrived on it for {wait:g} s (a pipe or FIFO nobody writes to?)")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        try:
            chunk = os.read(fd, min(MIB, limit + 1 - total))
        except BlockingIOError:
            continue
        if not chunk:
            if total or not fifo:
                break
            time.sleep(0.05)  # no writer yet
            continue
        chunks.append(chunk)
        total += len(chunk)
        quiet_since = time.monotonic()
    return b"".join(chunks)
