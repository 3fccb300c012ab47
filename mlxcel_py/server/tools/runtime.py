"""`--tools-runtime`: where every tool call runs unless its request names a runtime itself.

`docker:IMAGE` / `podman:IMAGE` start a container for this server (`<engine> run --rm -i IMAGE
sh`, its shell held open on stdin) and reuse it for every call; one that dies is started again,
and closing its stdin at shutdown ends it (`--rm` removes it). `docker-container:ID`,
`podman-container:ID` and `ssh:TARGET` name something that already runs: they are only checked
at startup (a bad one is exit 2), and left alone at shutdown.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time

from ...errors import MlxcelError, UsageError
from ...options import ToolsRuntimeSpec

START_WAIT_S = 30  # a container's id must appear within this long (an image pull can take a while)


class ToolsRuntime:
    """The runtime spec calls get; `spec()` names a running container for an owned one."""

    def __init__(self, spec: str):
        self._spec = spec
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        try:
            parsed = ToolsRuntimeSpec.parse(spec)  # validation checked it already; an API caller too
        except ValueError as exc:
            raise UsageError(f"--tools-runtime: {exc}") from None
        self.owned = parsed.kind == "image"
        self.engine, self.image = parsed.engine, parsed.target
        if self.owned:
            self._container = self._start()

    def _start(self) -> str:
        fd, cidfile = tempfile.mkstemp(prefix="mlxcel-tools-cid-")
        os.close(fd)
        os.unlink(cidfile)  # the engine refuses to write a cidfile that exists
        argv = [self.engine, "run", "--rm", "-i", "--cidfile", cidfile, self.image, "sh"]
        try:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        except OSError as exc:
            raise MlxcelError(f"--tools-runtime {self._spec}: cannot run {self.engine} ({exc.strerror})") from None
        deadline = time.monotonic() + START_WAIT_S
        cid = ""
        while time.monotonic() < deadline and not cid:
            if self._proc.poll() is not None:
                break
            try:
                with open(cidfile) as f:
                    cid = f.read().strip()
            except OSError:
                time.sleep(0.1)
        try:
            os.unlink(cidfile)
        except OSError:
            pass
        if not cid:
            self._stop()
            raise MlxcelError(f"--tools-runtime {self._spec}: the {self.engine} container did not start")
        return cid

    def spec(self) -> str:
        if not self.owned:
            return self._spec
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:  # died on its own: a new one
                self._container = self._start()
            return f"{self.engine}-container:{self._container}"

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            assert proc.stdin is not None
            proc.stdin.close()  # the container's shell (its pid 1) reads EOF and exits; --rm removes it
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()

    def close(self) -> None:
        with self._lock:
            self._stop()
