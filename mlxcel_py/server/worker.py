"""One MLX worker thread behind a bounded queue, decoding up to `-np` requests together.

All model work (warmup included) runs on this thread. Each tick it admits waiting jobs into free
slots, then gives every live slot its turn: each asks for its next forward (a plain step, a
verify round's block, or, for a new request, one prompt chunk); those run as one batched forward
(`batch.batched_forward`; one forward per sequence where the model cannot batch). Where batches
are ragged (`Gate.prefill_chunk`) a prompt chunk rides in that forward; elsewhere it is its own
forward between the others' steps.
Verify rounds run while at most `--prompt-lookup-max-batch` requests are live and they pay at the
batch's measured cost (`gate.Gate`). A speculating request's verify block joins the
same forward, which measured 1.7-2x faster than verifying two requests in turn
(scripts/batch_step_cost.py --verify). A request owns its cache while it runs (the engine's prompt cache hands finished ones on).

Each slot's turn hands its text pieces to the event loop in one call (a streaming request's; a
request read whole gets only its result), since every hand-off wakes the loop, which then competes
with this thread for the GIL.

Under LoRA adapters each set of adapter scales is its own engine (adapter_variants): a slot
decodes on its job's, and each engine's slots share a batched forward of their own.

A client that disconnects (streaming or not) sets its job's cancel flag: a queued job is skipped,
a running one stops at its next turn and frees its slot. Beyond `max_queue` waiting jobs, `submit`
refuses at once (`Busy`, a 503 with Retry-After) instead of letting the queue grow without bound.

With a `sleep.Resident` (--sleep-idle-seconds), a worker that has had nothing to do for that long
releases the model while it waits; the next job or task (a request, a slot file, embeddings)
loads it again first. Reads that do not queue anything (/health, /props, /metrics, /slots) neither
wake it nor reset the idle clock, as in llama-server.
"""

from __future__ import annotations

import asyncio
import math
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..engine.context_shift import ContextShift
from ..engine.text import TextStream
from ..options import SamplingOptions
from ..parallel import distributed

if TYPE_CHECKING:
    from ..engine.generation import RoundLoop, Tick
    from ..engine.grammar import OutputRule
    from ..engine.text import TextPiece
    from ..formats.grammars import GrammarSpec


@dataclass
class Job:
    prompt: list[int]
    max_tokens: int
    sampling: SamplingOptions
    stop: Sequence[str] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # top-N per token ("logprobs" events before each text piece)
    post_sampling: bool = False  # those after the sampler chain (llama-server's post_sampling_probs)
    pieces: bool = True  # the consumer reads text as it comes (streaming); else only "done"/"error"
    speculative: bool = True  # False: this request decodes plainly (speculative.n_max 0)
    min_draft: int | None = None  # speculative.n_min, else the server's --draft-min (None: the engine's)
    cache_prompt: bool = True  # False: no cached prefix is reused, the whole prompt is fed (llama-server's)
    predict_ms: float | None = None  # time limit for decoding, from the first piece (t_max_predict_ms)
    grammar: GrammarSpec | None = None  # what the output follows
    constraint: OutputRule | None = None  # `grammar` compiled (by the route, off this thread)
    shift: ContextShift | None = None  # --context-shift: what a full window drops (None: it ends the reply)
    progress: bool = False  # "progress" events while the prompt is fed (llama-server's return_progress)
    timings_per_token: bool = False  # a stream's every chunk carries `timings` (llama-server's)
    adapter_scales: tuple[float, ...] | None = None  # its `lora` scales (None: the server's, POST /lora-adapters)
    loop: asyncio.AbstractEventLoop | None = None
    events: asyncio.Queue | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    generation: RoundLoop | None = None  # while it runs (/slots reads its progress)

    def cancel(self) -> None:
        self.cancelled.set()


@dataclass
class Task:
    """A call for the model's thread, run between steps (slot files read and write caches there:
    no other thread runs MLX); its result or exception goes to `future` on the event loop."""

    fn: Callable[[], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future

    def run(self) -> None:
        try:
            result = self.fn()
        except Exception as exc:
            self.loop.call_soon_threadsafe(_settle, self.future, None, exc)
        else:
            self.loop.call_soon_threadsafe(_settle, self.future, result, None)

    def cancel(self) -> None:
        self.fail(RuntimeError("the server is shutting down"))

    def fail(self, exc: BaseException) -> None:
        self.loop.call_soon_threadsafe(_settle, self.future, None, exc)


def _settle(future: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    if not future.done():
        future.set_result(result) if exc is None else future.set_exception(exc)


class ShuttingDown(str):
    """An error event's payload when shutdown stopped the job (not a generation failure)."""


@dataclass
class Result:
    text: str
    tokens: list[int]
    finish_reason: str
    stop_word: str | None
    stats: Any
    speculative: bool
    logprobs: list = field(default_factory=list)  # engine.TokenLogprob per emitted token, when asked


def _put_all(q: asyncio.Queue, events: list) -> None:
    for e in events:
        q.put_nowait(e)


class Busy(Exception):
    """The queue is full: the client should retry later."""


MAX_QUEUE = 64


@dataclass
class Slot:
    """One live request: its job, generation, text stream and progress."""

    id: int
    job: Job
    gen: RoundLoop
    stream: TextStream
    pieces: Iterator[TextPiece | Tick]  # over the stream
    sent: int = 0  # logprobs already emitted
    deadline: float | None = None  # monotonic time its decoding must end (set at its first piece)
    timed_out: bool = False  # ended by its deadline: finish_reason "length"
    progress_sent: int = 0  # prompt progress reports emitted
    engine: Any = None  # the engine it decodes on (one per set of adapter scales: adapter_variants)


class Worker:
    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        *,
        speculative_allowed: bool = True,
        max_queue: int = MAX_QUEUE,
        parallel: int = 1,
        max_batch: int | None = 2,
        resident: Any = None,
    ):
        from ..engine.gate import Gate

        self.engine = engine
        self.tokenizer = tokenizer
        self.speculative_allowed = speculative_allowed
        self.max_queue = max_queue
        self.parallel = max(1, parallel)
        self.gate = Gate(max_batch)
        self.shutting_down: str | None = None  # set by shut_down: why every job is stopping
        self.probe = None  # batch.Probe, at start when parallel > 1
        self.slots: list[Slot | None] = [None] * self.parallel
        self.metrics = None  # metrics.Metrics: every ended request is counted
        self.jobs: queue.Queue[Job | Task | None] = queue.Queue()
        self.served = 0
        self.ready = threading.Event()
        self.warmup_error: str | None = None
        self._stopping = False
        self.resident = resident  # sleep.Resident: the model is released when idle (None: never)
        self.variants = None  # adapter_variants.AdapterVariants: other adapter scales' engines (None: one)
        # when the last job or task ended; the clock starts when the server says it is serving
        # (`serving`), so the model is not released while startup still holds it
        self.idle_since = math.inf
        self.thread = threading.Thread(target=self._loop, name="mlx-worker", daemon=True)

    def start(self, warmup: bool) -> None:
        self._warmup = warmup
        self.thread.start()
        self.ready.wait()

    @property
    def alive(self) -> bool:
        """Can take requests: the thread runs and warmup (if any) succeeded."""
        return self.thread.is_alive() and self.warmup_error is None

    @property
    def asleep(self) -> bool:
        return self.resident is not None and self.resident.asleep

    @property
    def active(self) -> int:
        return sum(s is not None for s in self.slots)

    @property
    def queue_depth(self) -> int:
        return self.jobs.qsize()

    def _emit(self, job: Job, kind: str, payload: Any) -> None:
        self._emit_all(job, [(kind, payload)])

    def _emit_all(self, job: Job, events: list) -> None:
        """A turn's events in one hand-off: each call wakes the event loop (a socket write and a
        pass of the loop, competing with this thread for the GIL), once per request per step
        instead of once per token."""
        if events:
            assert job.loop is not None and job.events is not None
            job.loop.call_soon_threadsafe(_put_all, job.events, events)

    def _loop(self) -> None:
        from ..cpu import kernels as cpu_kernels
        from ..engine.batch import probe, ragged
        from ..engine.cache import PREFILL_CHUNK
        from ..engine.gate import measure_costs

        try:
            if self._warmup:
                self.engine.warmup()
            if self.parallel > 1 and self.engine.channel is None:
                self.probe = probe(self.engine.model, self.engine.vocab_size or 2)
                if self.probe.mode == "exact" and ragged(self.engine.model):
                    self.gate.prefill_chunk = cpu_kernels.prefill_chunk(self.engine.model, PREFILL_CHUNK)
                    if self.speculative_allowed and not os.environ.get("MLXCEL_GATE_COUNT_ONLY"):  # A/B runs
                        self.gate.costs = measure_costs(self.engine.model, self.engine.vocab_size or 2)
        except Exception as exc:  # pragma: no cover - reported at startup
            self.warmup_error = str(exc)
        self.ready.set()
        while True:
            if not self._admit():
                return
            live = [s for s in self.slots if s is not None]
            if not live:
                continue
            self.idle_since = time.monotonic()
            self.gate.tick(len(live))
            for slot in live:
                self._turn(slot)
            self._step([s for s in live if self.slots[s.id] is s and s.gen.step_request is not None])

    def _admit(self) -> bool:
        """Fill free slots from the queue (waiting for one job when nothing is live); False to stop."""
        while None in self.slots:
            idle = all(s is None for s in self.slots)
            if idle and self._stopping:
                return False
            try:
                job = self._wait() if idle and not self._stopping else self.jobs.get_nowait()
            except queue.Empty:
                return True
            if job is None:
                self._stopping = True
                for s in self.slots:
                    if s is not None:
                        s.job.cancel()
                if idle:
                    return False
                continue
            if isinstance(job, Task):
                if self._stopping:
                    job.cancel()
                elif (why := self._wake()) is not None:
                    job.fail(RuntimeError(why))
                else:
                    job.run()
                    self.idle_since = time.monotonic()
                continue
            if job.cancelled.is_set():
                if self.shutting_down:  # its client still waits: a stream gets its error and [DONE]
                    self._emit(job, "error", ShuttingDown(self.shutting_down))
                continue
            if (why := self._wake()) is not None:
                self._emit(job, "error", why)
                continue
            self._start(self.slots.index(None), job)
        return True

    def _wait(self) -> Job | Task | None:
        """The next job, with nothing live; the model is released once it has waited
        --sleep-idle-seconds (then it waits on, asleep)."""
        while self.resident is not None and not self.resident.asleep:
            left = self.idle_since + self.resident.idle_seconds - time.monotonic()
            if left <= 0:
                try:
                    if self.metrics is not None:  # scrapes read this until it wakes
                        self.metrics.sleeping()
                    if self.variants is not None:
                        self.variants.release()
                    self.resident.release()
                except Exception as exc:  # the worker must outlive a failed release
                    sys.stderr.write(f"mlxcel serve: sleep failed: {type(exc).__name__}: {exc}\n")
                    if self.engine.released:  # the weights went before it failed: the next job loads them
                        self.resident.asleep = True
                        break
                    if self.metrics is not None:  # still awake: scrapes read the live counters
                        self.metrics.woke()
                    self.idle_since = time.monotonic()
                    continue
                break
            try:
                return self.jobs.get(timeout=min(left, 1.0))  # a second at most: `serving` may start the clock
            except queue.Empty:
                continue
        return self.jobs.get()

    def serving(self) -> None:
        """Start the idle clock (--sleep-idle-seconds): the server now answers requests."""
        self.idle_since = time.monotonic()

    def _wake(self) -> str | None:
        """Load the model again if it sleeps; why it could not (the job gets that as its error,
        the server stays asleep and the next request tries again)."""
        if not self.asleep:
            return None
        try:
            self.resident.restore()
        except Exception as exc:  # a load failure of any kind, reported to the request
            self.engine.release()  # a half-adopted engine stays released
            return f"the model could not be loaded again after sleeping: {exc}"
        finally:
            self.idle_since = time.monotonic()
        if self.metrics is not None:
            self.metrics.woke()
        return None

    def _engine_for(self, job: Job) -> Any:
        """The engine for the job's adapter scales (its own, else the server's), loading a fused
        model for scales no kept engine has (never dropping one a live slot decodes on)."""
        if self.variants is None:
            return self.engine
        scales = job.adapter_scales if job.adapter_scales is not None else self.variants.scales
        return self.variants.engine(scales, busy={id(s.engine) for s in self.slots if s is not None})

    def _start(self, i: int, job: Job) -> None:
        spec = self.speculative_allowed and job.speculative
        try:
            engine = self._engine_for(job)
        except Exception as exc:  # a fused model that cannot load fails this request, not the server
            self._emit(job, "error", f"the adapters could not be loaded at the asked scales: {exc}")
            return
        # compiled before the job was queued: a grammar's compile (up to its time budget) on this
        # thread would stall every live request's decoding
        assert job.grammar is None or job.constraint is not None, "a job's grammar is compiled by its route"
        gen = engine.generate(
            job.prompt,
            max_tokens=job.max_tokens,
            sampling=job.sampling,
            speculative=spec,
            reuse_prefix=job.cache_prompt,
            ignore_eos=job.ignore_eos,
            cancelled=job.cancelled.is_set,
            logprobs=job.logprobs,
            gate=self.gate,
            constraint=job.constraint,
            min_draft=job.min_draft,
            context_shift=job.shift,
            post_sampling=job.post_sampling,
        )
        job.generation = gen
        stream = TextStream(gen, self.tokenizer, job.stop)
        self.slots[i] = Slot(i, job, gen, stream, iter(stream), engine=engine)

    def _turn(self, slot: Slot) -> None:
        """Run one slot until it asks for a plain step, pauses or ends; its text goes out at the end
        of the turn, in one hand-off."""
        job = slot.job
        out: list = []  # this turn's events, handed over together before the result or error
        try:
            try:
                ended = self._advance(slot, out)
            finally:
                self._emit_all(job, out)
            if ended:
                self._finish(slot)
        except Exception as exc:
            self._fail(slot, exc)

    def _advance(self, slot: Slot, out: list) -> bool:
        """Collect the slot's pieces into `out` until it asks for a step or pauses (False) or is
        cancelled or done (True)."""
        from ..engine.generation import NEED_STEP, PAUSE

        job = slot.job
        while True:
            if job.cancelled.is_set():
                return True
            if slot.deadline is not None and time.monotonic() >= slot.deadline:
                slot.timed_out = True  # as llama-server's t_max_predict_ms: a "length" finish
                return True
            try:
                item = next(slot.pieces)
            except StopIteration:
                return True
            if job.progress and len(slot.gen.progress) > slot.progress_sent:
                out += [("progress", p) for p in slot.gen.progress[slot.progress_sent :]]
                slot.progress_sent = len(slot.gen.progress)
            if item is PAUSE or item is NEED_STEP:
                return False
            if slot.deadline is None and job.predict_ms is not None:
                slot.deadline = time.monotonic() + job.predict_ms / 1000
            if not job.pieces:  # the consumer takes only the result
                continue
            if job.logprobs is not None:  # the logprobs of the tokens this piece completes
                out.append(("logprobs", slot.gen.logprobs_out[slot.sent : item.tokens]))
                slot.sent = item.tokens
            out.append(("text", item))

    def _step(self, wanting: list[Slot]) -> None:
        """The plain steps the live slots asked for: one batched forward (or one per sequence)
        for each engine they decode on (requests under other adapter scales run other weights)."""
        groups: dict[int, list[Slot]] = {}
        for s in wanting:
            groups.setdefault(id(s.engine), []).append(s)
        for group in groups.values():
            self._forward(group)

    def _forward(self, wanting: list[Slot]) -> None:
        from ..engine.batch import batched_forward, solo_forward

        seqs, blocks, wants, trees = (list(x) for x in zip(*(s.gen.step_request for s in wanting)))
        try:
            if len(wanting) > 1 and self.probe is not None and self.probe.batches:
                rows = batched_forward(wanting[0].engine.model, seqs, blocks, wants, trees)
            else:
                rows = solo_forward(seqs, blocks, trees)
        except Exception as exc:
            for s in wanting:
                self._fail(s, exc)
            return
        for s, r in zip(wanting, rows):
            s.gen.step_result = r
        if self.metrics is not None:
            self.metrics.forward(len(wanting))

    def _finish(self, slot: Slot) -> None:
        job, gen, stream = slot.job, slot.gen, slot.stream
        slot.pieces.close()
        gen.close()
        finish = stream.finish_reason or (
            "cancelled" if job.cancelled.is_set() else "length" if slot.timed_out else "stop"
        )
        if self.metrics is not None:
            self.metrics.record(gen.stats, "cancelled" if job.cancelled.is_set() else finish)
        # the slot is free before the client holds its result: what it reads next (/metrics,
        # /slots) no longer counts this request as processing
        self._free(slot)
        # stopped by shutdown (the generation may have seen the cancel itself and said "cancelled"):
        # the client gets the shutdown error, not a reply cut short that looks whole
        if job.cancelled.is_set() and self.shutting_down and stream.finish_reason in (None, "cancelled"):
            self._emit(job, "error", ShuttingDown(self.shutting_down))
            return
        self._emit(
            job,
            "done",
            Result(
                stream.text,
                list(gen.tokens),
                finish,
                stream.stop_word,
                gen.stats,
                self.speculative_allowed,
                list(gen.logprobs_out),
            ),
        )

    def _fail(self, slot: Slot, exc: Exception) -> None:
        if self.metrics is not None:
            self.metrics.record(None, "error")
        try:
            slot.gen.close()
        except Exception:
            pass
        self._free(slot)  # before the client hears of it, as in _finish
        self._emit(slot.job, "error", f"{type(exc).__name__}: {exc}")
        world = getattr(self.engine.channel, "world", None)
        if distributed.is_lost_contact(exc, world):  # the model is gone with that rank: stop serving
            sys.stderr.write(distributed.lost(exc, 0).format() + "\n")
            os.kill(os.getpid(), signal.SIGTERM)

    def _free(self, slot: Slot) -> None:
        if self.slots[slot.id] is slot:
            self.slots[slot.id] = None
            self.served += 1

    def admit(self, job: Job) -> None:
        """Queue a job, or refuse it at once when `max_queue` jobs already wait."""
        if self.jobs.qsize() >= self.max_queue:
            raise Busy(f"{self.jobs.qsize()} requests are waiting")
        job.loop = asyncio.get_running_loop()
        job.events = asyncio.Queue()
        self.jobs.put(job)

    async def submit(self, job: Job) -> AsyncIterator[tuple[str, Any]]:
        if job.events is None:
            self.admit(job)
        try:
            while True:
                kind, payload = await job.events.get()
                yield kind, payload
                if kind in ("done", "error"):
                    return
        finally:
            job.cancel()

    async def call(self, fn: Callable[[], Any]) -> Any:
        """`fn()` on the model's thread, between steps (after the running requests' current turn)."""
        if not self.alive:
            raise RuntimeError("the model's thread is not running")
        loop = asyncio.get_running_loop()
        task = Task(fn, loop, loop.create_future())
        self.jobs.put(task)
        return await task.future

    def shut_down(self, reason: str) -> None:
        """Shutdown's last moment before its grace runs out: every job stops, and its client gets
        `reason` as an error event (a stream its final error chunk and [DONE]) instead of a cut."""
        self.shutting_down = reason
        self.cancel_all()

    def cancel_all(self) -> None:
        """Shutdown: every queued job is skipped and the running ones stop at their next turn."""
        for slot in list(self.slots):
            if slot is not None:
                slot.job.cancel()
        for job in list(self.jobs.queue):
            if job is not None:
                job.cancel()

    def stop(self) -> None:
        self.cancel_all()
        self.jobs.put(None)
