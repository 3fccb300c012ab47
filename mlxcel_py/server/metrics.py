"""`/metrics` in Prometheus text format (behind `--metrics`, as llama-server and mlxcel serve it).

Two families side by side:
- ours, under `mlxcel_` names (prometheus_client, one registry per app): requests by outcome,
  prompt tokens (prefilled and served from the prompt cache), generated tokens, speculative
  rounds with the drafted and accepted tokens, requests processing and waiting, and the prompt
  cache's size;
- llama-server's `llamacpp:` series, written the way its `/metrics` writes them (a HELP and a
  TYPE line naming each series in full, `_total` included, and no `_created` companions), so
  dashboards and scrapers made for llama-server read this server unchanged. Its two throughput
  gauges are averaged over a window: what ran since the last scrape (each scrape empties it),
  and like llama-server the rate counts decode steps, not the first token, which comes with the
  prompt's last forward.

While the server sleeps (`--sleep-idle-seconds`) a scrape neither wakes it nor reads the released
model: it renders the snapshot taken just before the release, so the counters a dashboard sees
do not jump. A scrape while asleep empties the snapshot's window, and then, once the server
wakes, its live window too, so no throughput is reported twice (llama-server's rules, checked by
its test_sleep.py).

The worker thread records; HTTP threads render: one lock covers both.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # llama-server's


@dataclass
class _Bucket:
    count: int = 0  # tokens
    steps: int = 0  # forwards they took (a generation's first token needs none of its own)
    seconds: float = 0.0

    def add(self, count: int, steps: int, seconds: float) -> None:
        self.count += count
        self.steps += steps
        self.seconds += seconds

    def rate(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _LlamaTotals:
    """What llama-server's `/metrics` reports, counted since startup (the windows since the last scrape)."""

    prompt: _Bucket = field(default_factory=_Bucket)  # prefilled tokens only
    predict: _Bucket = field(default_factory=_Bucket)
    prompt_window: _Bucket = field(default_factory=_Bucket)
    predict_window: _Bucket = field(default_factory=_Bucket)
    cached: int = 0
    tokens_max: int = 0
    decodes: int = 0
    busy: int = 0
    drafted: int = 0
    accepted: int = 0
    verify_steps: int = 0

    def add_prompt(self, tokens: int, seconds: float) -> None:
        self.prompt.add(tokens, tokens, seconds)
        self.prompt_window.add(tokens, tokens, seconds)

    def add_predicted(self, tokens: int, seconds: float) -> None:
        """A generation's tokens; its decode steps are one fewer (the first comes with the prompt)."""
        self.predict.add(tokens, max(tokens - 1, 0), seconds)
        self.predict_window.add(tokens, max(tokens - 1, 0), seconds)

    def empty_windows(self) -> None:
        self.prompt_window = _Bucket()
        self.predict_window = _Bucket()

    def text(self, processing: int, deferred: int) -> str:
        counters = [
            ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", self.prompt.count),
            ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", self.cached),
            ("prompt_seconds_total", "Total time spent processing prompts", self.prompt.seconds),
            ("tokens_predicted_total", "Number of generation tokens processed", self.predict.count),
            ("tokens_predicted_seconds_total", "Total time spent generating tokens", self.predict.seconds),
            ("n_decode_total", "Total number of batched forwards (llama_decode() calls)", self.decodes),
            ("n_tokens_max", "Largest observed sequence length (prompt + generation)", self.tokens_max),
            ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", self.drafted),
            (
                "spec_decode_num_accepted_tokens_total",
                "Speculative: Total draft tokens accepted by the target model",
                self.accepted,
            ),
            (
                "spec_decode_num_drafts_total",
                "Speculative: Total speculative decoding verification steps",
                self.verify_steps,
            ),
        ]
        gauges = [
            ("prompt_tokens_seconds", "Average prompt throughput in tokens/s", self.prompt_window.rate()),
            ("predicted_tokens_seconds", "Average generation throughput in tokens/s", self.predict_window.rate()),
            ("requests_processing", "Number of requests processing", processing),
            ("requests_deferred", "Number of requests deferred", deferred),
            (
                "n_busy_slots_per_decode",
                "Average number of busy slots per batched forward",
                self.busy / max(self.decodes, 1),
            ),
        ]
        lines = []
        for kind, items in (("counter", counters), ("gauge", gauges)):
            for name, help_text, value in items:
                lines += [
                    f"# HELP llamacpp:{name} {help_text}",
                    f"# TYPE llamacpp:{name} {kind}",
                    f"llamacpp:{name} {value if isinstance(value, int) else float(value)}",
                ]
        return "\n".join(lines) + "\n"


class Metrics:
    def __init__(self, worker: Any, engine: Any):
        self.started = int(time.time())  # llama-server's Process-Start-Time-Unix header
        self._lock = threading.Lock()
        self._llama = _LlamaTotals()
        self._snapshot: tuple[_LlamaTotals, str] | None = None  # taken as the server falls asleep
        self._empty_on_wake = False  # a scrape while asleep reported the live window already
        self._worker = worker
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "mlxcel_requests", "Requests ended, by outcome (stop, length, cancelled, error)", ["outcome"], registry=r
        )
        self.prompt_tokens = Counter("mlxcel_prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.cached_tokens = Counter(
            "mlxcel_prompt_tokens_cached", "Prompt tokens served from the prompt cache", registry=r
        )
        self.predicted = Counter("mlxcel_tokens_predicted", "Tokens generated", registry=r)
        self.rounds = Counter("mlxcel_speculative_rounds", "Verify rounds that checked a draft", registry=r)
        self.drafted = Counter("mlxcel_draft_tokens", "Draft tokens proposed to verify rounds", registry=r)
        self.accepted = Counter("mlxcel_draft_tokens_accepted", "Draft tokens accepted", registry=r)
        Gauge("mlxcel_requests_processing", "Requests being decoded", registry=r).set_function(lambda: worker.active)
        Gauge("mlxcel_requests_deferred", "Requests waiting for the worker", registry=r).set_function(
            lambda: worker.queue_depth
        )
        pool = lambda: engine.prompt_cache  # noqa: E731  (set after the app is built)
        Gauge("mlxcel_prompt_cache_bytes", "Memory held by the prompt cache", registry=r).set_function(
            lambda: pool().bytes if pool() is not None else 0
        )
        Gauge("mlxcel_prompt_cache_entries", "Sequences held by the prompt cache", registry=r).set_function(
            lambda: pool().entries if pool() is not None else 0
        )

    # -- the worker thread's side ---------------------------------------------------------------
    def record(self, stats: Any, outcome: str) -> None:
        """One request ended (`stats` None: it failed before any)."""
        self.requests.labels(outcome=outcome).inc()
        if stats is None:
            return
        prompt = max(stats.prompt_tokens - stats.cached_tokens, 0)
        self.prompt_tokens.inc(prompt)
        self.cached_tokens.inc(stats.cached_tokens)
        self.predicted.inc(stats.generated_tokens)
        self.rounds.inc(stats.drafted_rounds)
        self.drafted.inc(stats.proposed)
        self.accepted.inc(stats.accepted)
        with self._lock:
            t = self._llama
            t.add_prompt(prompt, max(stats.prefill_s, 0.0))
            t.add_predicted(stats.generated_tokens, stats.predicted_s)
            t.cached += stats.cached_tokens
            t.tokens_max = max(t.tokens_max, stats.prompt_tokens + stats.generated_tokens)
            t.drafted += stats.proposed
            t.accepted += stats.accepted
            t.verify_steps += stats.drafted_rounds

    def prompts_fed(self, prompts: list[list[int]], run: Callable[[list[int]], Any]) -> Callable[[], list]:
        """A call for the worker's thread that runs each embedding or rerank prompt through `run`
        and counts it: prompt tokens and one forward each, nothing generated (llama-server's)."""

        def call() -> list:
            start = time.perf_counter()
            out = [run(p) for p in prompts]
            self._fed(sum(len(p) for p in prompts), time.perf_counter() - start, len(prompts))
            return out

        return call

    def _fed(self, tokens: int, seconds: float, forwards: int) -> None:
        self.prompt_tokens.inc(tokens)
        with self._lock:
            t = self._llama
            t.add_prompt(tokens, seconds)
            t.decodes += forwards
            t.busy += forwards

    def forward(self, slots: int) -> None:
        """One batched forward (or one sequence's) served `slots` requests."""
        with self._lock:
            self._llama.decodes += 1
            self._llama.busy += slots

    def sleeping(self) -> None:
        """The model is about to be released: what scrapes read until it wakes."""
        with self._lock:
            self._snapshot = (copy.deepcopy(self._llama), generate_latest(self.registry).decode())
            self._empty_on_wake = False

    def woke(self) -> None:
        with self._lock:
            self._snapshot = None
            if self._empty_on_wake:
                self._llama.empty_windows()
            self._empty_on_wake = False

    # -- a scrape ---------------------------------------------------------------------------------
    def render(self) -> bytes:
        with self._lock:
            if self._snapshot is not None:
                llama, ours = self._snapshot
                text = ours + llama.text(0, 0)
                self._empty_on_wake = True
            else:
                llama, ours = self._llama, generate_latest(self.registry).decode()
                w = self._worker
                text = ours + llama.text(w.active, w.queue_depth) if w is not None else ours + llama.text(0, 0)
            llama.empty_windows()  # each gauge averages what ran since the scrape before
        return text.encode()
