"""The router's model processes: one `mlxcel serve` per loaded model, on a loopback port of its
own, started on demand and stopped to make room.

A model is `unloaded`, `loading` (its process started, not yet listening) or `loaded`. Requests
for a model take it (`acquire`: loading it first where autoload allows, waiting while it loads)
and give it back (`release`) when their answer has been relayed; a model with a request in
flight is never stopped to make room. Starting a model takes a slot under one FIFO lock: at
`--models-max` running models the least recently used idle one is stopped, and when every one is
busy the start waits for one to come free (a client that leaves while it waits gives its place
up). Requests for a model that is already loading wait for that load instead of starting another.

Each process gets the router's own serve flags (what the command passed on), `--host 127.0.0.1
--port 0 --alias ID`, and a random API key through its environment, so nothing on this machine
but the router can use it; on Linux it is also told to stop if the router dies. Its stderr is
relayed line by line with the model's name in front, and its last lines say why a load failed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from ..http import ApiError
from .catalog import Entry, Preset

LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
LOAD_SECONDS = float(os.environ.get("MLXCEL_ROUTER_LOAD_TIMEOUT", "900"))  # a first GGUF conversion is slow
STOP_SECONDS = 10.0  # after SIGTERM, before SIGKILL (llama-server's stop-timeout)


class Instance:
    def __init__(self, entry: Entry):
        self.entry = entry
        self.status = "unloaded"
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.key = ""
        self.args: list[str] = []
        self.in_flight = 0
        self.last_used = 0.0
        self.exit_code: int | None = None
        self.failed = False
        self.stopping = False
        self.loaded_once = asyncio.Event()  # set when this start ends: listening, or exited
        self.gone = asyncio.Event()  # set when the process has exited
        self.tail: deque[str] = deque(maxlen=20)
        self.reason = ""  # why the router itself stopped a start (else the process's last line says)

    @property
    def running(self) -> bool:
        return self.status in ("loading", "loaded")

    def describe(self) -> dict:
        """llama-server's `status` object."""
        out: dict = {"value": self.status}
        if self.args:
            out["args"] = self.args
        if self.status == "unloaded" and self.failed:
            out["failed"], out["exit_code"] = True, self.exit_code
        return out

    def why_failed(self) -> str:
        last = self.reason or next((ln for ln in reversed(self.tail) if ln.strip()), "")
        code = f" (exit code {self.exit_code})" if self.exit_code is not None else ""
        return f"model {self.entry.id} failed to load{code}" + (f": {last.strip()[:300]}" if last else "")


class Instances:
    def __init__(
        self,
        entries: Sequence[Entry],
        child_argv: Sequence[str],
        *,
        max_instances: int,
        autoload: bool,
        say: Callable[[str], None] = lambda s: None,
        python: str = sys.executable,
        preset: Preset | None = None,
    ):
        self.by_id = {e.id: Instance(e) for e in entries}
        self.child_argv = list(child_argv)
        self.preset = preset or Preset()
        self.load_seconds = LOAD_SECONDS
        self.max_instances = max_instances  # 0: no limit
        self.autoload = autoload
        self.say = say
        self.python = python
        self.listeners: list[asyncio.Queue] = []  # GET /models/sse streams
        self.downloads: dict[str, Download] = {}  # POST /models in progress, by the id asked for
        self.checking: set[str] = set()  # POST /models whose repo the hub is still being asked about
        self.fake_timing = bool(os.environ.get("LLAMA_SERVER_DEBUG_FAKE_TIMING"))  # llama-server's test knob
        self._start_lock: asyncio.Lock | None = None
        self._changed: asyncio.Condition | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- bookkeeping ---------------------------------------------------------------------------
    def _bind(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._start_lock, self._changed = asyncio.Lock(), asyncio.Condition()

    def get(self, model_id: object) -> Instance:
        if not isinstance(model_id, str) or not model_id:
            raise ApiError('the request names no model: give its id in "model" (GET /models lists them)')
        inst = self.by_id.get(model_id)
        if inst is None:
            raise ApiError(f"model {model_id[:200]!r} not found (GET /models lists this router's models)")
        return inst

    def running(self) -> list[Instance]:
        return [i for i in self.by_id.values() if i.running]

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _changed_soon(self) -> None:
        asyncio.ensure_future(self._notify())

    def emit(self, model: str, event: str, data: dict | None = None) -> None:
        """One event for every /models/sse listener (llama-server's `{model, event, data}`)."""
        item = {"model": model, "event": event, **({"data": data} if data is not None else {})}
        for q in list(self.listeners):
            q.put_nowait(item)

    # -- the model list ------------------------------------------------------------------------
    async def reconcile(self, entries: Sequence[Entry], preset: Preset) -> None:
        """GET /models?reload=1: the folder and preset read again. A model gone from them, or
        whose path changed, is stopped if running; new ones are added; the preset's flags apply
        to every start from now on."""
        self._bind()
        wanted = {e.id: e for e in entries}
        for model_id, inst in list(self.by_id.items()):
            if wanted.get(model_id) != inst.entry:
                if inst.running:
                    await self.stop(inst)
                del self.by_id[model_id]
                if model_id not in wanted:
                    self.emit(model_id, "model_remove")
        for model_id, e in wanted.items():
            if model_id not in self.by_id:
                self.by_id[model_id] = Instance(e)
        self.preset = preset
        self.emit("*", "models_reload")

    # -- requests ------------------------------------------------------------------------------
    async def acquire(
        self, model_id: object, autoload: bool | None = None, gone: Callable[[], Awaitable[bool]] | None = None
    ) -> Instance:
        """A loaded model for one request (counted in flight until `release`)."""
        self._bind()
        inst = self.get(model_id)
        autoload = self.autoload if autoload is None else autoload
        while True:
            if self.by_id.get(inst.entry.id) is not inst:  # dropped by a reload while this request waited
                raise ApiError(f"model {inst.entry.id} was removed from this router's list (GET /models?reload=1)")
            if inst.status == "loaded" and not inst.stopping:
                inst.in_flight += 1
                inst.last_used = time.monotonic()
                if self.fake_timing:  # counted busy while it waits, as llama-server's router does
                    await asyncio.sleep(2)
                return inst
            if inst.status == "loading" or inst.stopping:
                stopping = inst.stopping  # a model being stopped: wait for it to be gone, then start it again
                await (inst.gone if stopping else inst.loaded_once).wait()
                if not stopping and inst.status == "unloaded" and inst.failed:
                    raise ApiError(inst.why_failed(), status=503, type="unavailable_error")
                continue
            if not autoload:
                raise ApiError(
                    f"model {inst.entry.id} is not loaded; load it with POST /models/load "
                    "(or start the router without --no-models-autoload)"
                )
            await self.start(inst, gone)

    def release(self, inst: Instance) -> None:
        inst.in_flight -= 1
        inst.last_used = time.monotonic()
        self._changed_soon()

    # -- starting and stopping -----------------------------------------------------------------
    async def start(self, inst: Instance, gone: Callable[[], Awaitable[bool]] | None = None) -> None:
        """Start `inst` if it is unloaded, making room first (FIFO with other starts)."""
        self._bind()
        if self.fake_timing:  # before the queue, as llama-server's load
            await asyncio.sleep(2)
        async with self._start_lock:
            if inst.status != "unloaded":
                return
            await self._make_room(gone)
            self._spawn(inst)

    async def _make_room(self, gone: Callable[[], Awaitable[bool]] | None) -> None:
        while self.max_instances and len(self.running()) >= self.max_instances:
            if gone is not None and await gone():  # a client that left gives its place up before it costs one
                raise ApiError("the client left while its model waited for a free place", status=499)
            idle = [i for i in self.running() if i.status == "loaded" and i.in_flight == 0 and not i.stopping]
            if idle:
                await self.stop(min(idle, key=lambda i: i.last_used))
                continue
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait(), 0.5)
                except asyncio.TimeoutError:
                    pass
            if gone is not None and await gone():
                raise ApiError("the client left while its model waited for a free place", status=499)

    def _spawn(self, inst: Instance) -> None:
        e = inst.entry
        inst.key = secrets.token_urlsafe(24)
        flags = ["-m", str(e.path)] + (["--mmproj", str(e.mmproj)] if e.mmproj else [])
        flags += ["--draft-model", str(e.draft)] if e.draft else []
        # a preset's [*] and [ID] flags, then the command line's: the last spelling of a flag counts
        flags += ["--host", "127.0.0.1", "--port", "0", "--alias", e.id, *self.preset.flags_for(e.id), *self.child_argv]
        inst.args = ["mlxcel", "serve", *flags]
        env = dict(os.environ, LLAMA_API_KEY=inst.key)
        inst.status, inst.port, inst.failed, inst.exit_code, inst.stopping = "loading", None, False, None, False
        inst.loaded_once, inst.gone = asyncio.Event(), asyncio.Event()
        inst.tail.clear()
        inst.reason = ""
        self.say(f"router: starting {e.id}")
        self.emit(e.id, "model_status", {"status": "loading"})
        inst.proc = subprocess.Popen(
            [self.python, "-m", "mlxcel_py", "serve", *flags],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env=env,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,  # noqa: PLW1509
        )
        threading.Thread(target=self._watch, args=(inst, inst.proc), name=f"router-{e.id}", daemon=True).start()
        self._loop.call_later(self.load_seconds, self._overdue, inst, inst.proc)

    def _overdue(self, inst: Instance, proc: subprocess.Popen) -> None:
        """A process still not listening after load_seconds is stopped: its load has failed."""
        if inst.proc is proc and inst.status == "loading":
            inst.reason = f"not listening after {self.load_seconds:g} s (MLXCEL_ROUTER_LOAD_TIMEOUT)"
            proc.kill()  # _exited marks it failed, and its waiting requests get the 503

    def _watch(self, inst: Instance, proc: subprocess.Popen) -> None:
        """The process's stderr, relayed; its port once it listens; its exit."""
        assert proc.stderr is not None and self._loop is not None
        for line in proc.stderr:
            inst.tail.append(line.rstrip("\n"))
            sys.stderr.write(f"[{inst.entry.id}] {line}")
            m = LISTENING.search(line)
            if m is not None:
                self._post(self._listening, inst, proc, int(m.group(1)))
        self._post(self._exited, inst, proc, proc.wait())

    def _post(self, fn, *args) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the router's loop has closed (it is exiting): nobody waits for news
            pass

    def _listening(self, inst: Instance, proc: subprocess.Popen, port: int) -> None:
        if inst.proc is proc and inst.status == "loading":
            inst.status, inst.port = "loaded", port
            inst.last_used = time.monotonic()
            inst.loaded_once.set()
            self.say(f"router: {inst.entry.id} loaded")
            self.emit(inst.entry.id, "model_status", {"status": "loaded"})
            self._changed_soon()

    def _exited(self, inst: Instance, proc: subprocess.Popen, code: int) -> None:
        if inst.proc is not proc:
            return
        inst.failed = not inst.stopping  # it stopped without being asked: at load, or later
        inst.status, inst.port, inst.proc, inst.exit_code = "unloaded", None, None, code
        inst.stopping = False
        inst.loaded_once.set()
        inst.gone.set()
        self.say(f"router: {inst.entry.id} " + (f"exited with code {code}" if inst.failed else "unloaded"))
        status = {"status": "unloaded", **({"failed": True, "exit_code": code} if inst.failed else {})}
        self.emit(inst.entry.id, "model_status", status)
        self._changed_soon()

    async def stop(self, inst: Instance) -> None:
        """Stop a running model (SIGTERM: its requests in flight get the server's shutdown grace)."""
        proc = inst.proc
        if proc is None or not inst.running:
            return
        inst.stopping = True
        proc.terminate()
        try:
            await asyncio.wait_for(inst.gone.wait(), self.preset.stop_timeout.get(inst.entry.id, STOP_SECONDS))
        except asyncio.TimeoutError:
            proc.kill()
            await inst.gone.wait()

    async def unload(self, model_id: object) -> None:
        self._bind()
        inst = self.get(model_id)
        if not inst.running:
            raise ApiError(f"model {inst.entry.id} is not running")
        await self.stop(inst)

    async def load(self, model_id: object) -> None:
        """Start loading (the answer does not wait for it: GET /models says when it is loaded)."""
        self._bind()
        inst = self.get(model_id)
        if inst.running:
            raise ApiError(f"model {inst.entry.id} is already running")
        await self.start(inst)

    # -- the Hugging Face cache: POST /models downloads, DELETE /models removes ----------------
    async def download(self, spec: str, finished: Callable[[], Awaitable[None]]) -> None:
        """Start downloading `spec`, once its process has found it on the hub (else the ApiError
        saying why); its progress and end are /models/sse events, and `finished` (the list read
        again) runs before download_finished."""
        self._bind()
        if spec in self.by_id or spec in self.downloads or spec in self.checking:
            raise ApiError(f"model '{spec[:200]}' already exists")
        self.checking.add(spec)  # a second POST of it while the hub is asked is refused too
        try:
            await self._start_download(spec, finished)
        finally:
            self.checking.discard(spec)

    async def _start_download(self, spec: str, finished: Callable[[], Awaitable[None]]) -> None:
        env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
        proc = await asyncio.create_subprocess_exec(
            self.python,
            "-m",
            "mlxcel_py.server.router.downloads",
            spec,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            limit=1 << 20,
        )
        assert proc.stdout is not None
        try:
            first = json.loads(await asyncio.wait_for(proc.stdout.readline(), 120) or b"{}")
        except (asyncio.TimeoutError, ValueError):
            first = {"error": "the hub did not answer in 120 s"}
        if "files" not in first:
            _kill_group(proc.pid)
            await proc.wait()
            raise ApiError(f"cannot download {spec[:200]}: {first.get('error') or 'no answer from the hub'}")
        job = self.downloads[spec] = Download(spec, proc)
        self.say(f"router: downloading {spec} ({', '.join(first['files'])[:300]})")
        job.task = asyncio.ensure_future(self._follow(job, finished))

    async def _follow(self, job: Download, finished: Callable[[], Awaitable[None]]) -> None:
        result, error = "download_failed", "the download process ended without a result"
        assert job.proc.stdout is not None
        async for raw in job.proc.stdout:
            try:
                item = json.loads(raw)
            except ValueError:
                continue
            if "result" in item:
                result, error = item["result"], item.get("error", "")
                continue
            job.progress[item.get("url", "")] = {"done": item.get("downloaded", 0), "total": item.get("total", 0)}
            self.emit(job.spec, "download_progress", {"progress": dict(job.progress)})
        await job.proc.wait()
        if self.downloads.get(job.spec) is not job:  # cancelled by DELETE /models
            return
        del self.downloads[job.spec]
        if result == "download_finished":
            await finished()
            self.say(f"router: downloaded {job.spec}")
        else:
            self.say(f"router: download of {job.spec} failed: {error}")
        self.emit(job.spec, result, {"error": error} if error and result != "download_finished" else None)

    async def remove(self, model_id: object, root, finished: Callable[[], Awaitable[None]]) -> None:
        """DELETE /models: a cache model stopped and its files deleted, or a download cancelled."""
        from ...models import hub_cache

        self._bind()
        job = self.downloads.pop(model_id, None) if isinstance(model_id, str) else None
        if job is not None:
            _kill_group(job.proc.pid)
            await job.proc.wait()
            repo, tag = hub_cache.split_spec(job.spec)
            if tag:  # files of it that had arrived (a split model's first shards)
                await asyncio.get_running_loop().run_in_executor(None, hub_cache.remove, root, job.spec)
            if not any(hub_cache.split_spec(other)[0] == repo for other in self.downloads):  # none still writing
                await asyncio.get_running_loop().run_in_executor(None, hub_cache.discard_partial, root, repo)
            self.emit(job.spec, "model_remove")
            return
        inst = self.get(model_id)
        if inst.entry.source != "cache":
            raise ApiError(f"model {inst.entry.id} is not removable (not from the Hugging Face cache)")
        if inst.running:
            await self.stop(inst)
        await asyncio.get_running_loop().run_in_executor(None, hub_cache.remove, root, inst.entry.id)
        await finished()  # the list read again: the model is gone from it (reconcile says model_remove)

    def shutdown(self) -> None:
        """Stop every process (the router is exiting): SIGTERM, then SIGKILL after STOP_SECONDS."""
        for job in list(self.downloads.values()):
            _kill_group(job.proc.pid)
        procs = [i.proc for i in self.by_id.values() if i.proc is not None]
        for p in procs:
            for i in self.by_id.values():
                if i.proc is p:
                    i.stopping = True
            try:
                p.terminate()
            except OSError:
                pass
        deadline = time.monotonic() + STOP_SECONDS
        for p in procs:
            try:
                p.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class Download:
    def __init__(self, spec: str, proc: asyncio.subprocess.Process):
        self.spec, self.proc = spec, proc
        self.progress: dict[str, dict] = {}  # url -> {"done", "total"} bytes, llama-server's
        self.task: asyncio.Future | None = None


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the download and anything it started
    except (ProcessLookupError, PermissionError):
        pass


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the router dies (Linux's PR_SET_PDEATHSIG)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except OSError:
        pass
