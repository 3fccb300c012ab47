"""`/metrics` in Prometheus text format (prometheus_client), one registry per app.

llama-server's counters and gauges under `mlxcel_` names: requests by outcome, prompt tokens
(prefilled and served from the prompt cache), generated tokens, speculative rounds with the
drafted and accepted tokens, requests processing and waiting, and the prompt cache's size.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self, worker: Any, engine: Any):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("mlxcel_requests", "Requests ended, by outcome (stop, length, cancelled, error)",
                                ["outcome"], registry=r)
        self.prompt_tokens = Counter("mlxcel_prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.cached_tokens = Counter("mlxcel_prompt_tokens_cached", "Prompt tokens served from the prompt cache",
                                     registry=r)
        self.predicted = Counter("mlxcel_tokens_predicted", "Tokens generated", registry=r)
        self.rounds = Counter("mlxcel_speculative_rounds", "Verify rounds that checked a draft", registry=r)
        self.drafted = Counter("mlxcel_draft_tokens", "Draft tokens proposed to verify rounds", registry=r)
        self.accepted = Counter("mlxcel_draft_tokens_accepted", "Draft tokens accepted", registry=r)
        Gauge("mlxcel_requests_processing", "Requests being decoded", registry=r).set_function(lambda: worker.active)
        Gauge("mlxcel_requests_deferred", "Requests waiting for the worker", registry=r).set_function(
            lambda: worker.queue_depth)
        pool = lambda: engine.prompt_cache  # noqa: E731  (set after the app is built)
        Gauge("mlxcel_prompt_cache_bytes", "Memory held by the prompt cache", registry=r).set_function(
            lambda: pool().bytes if pool() is not None else 0)
        Gauge("mlxcel_prompt_cache_entries", "Sequences held by the prompt cache", registry=r).set_function(
            lambda: pool().entries if pool() is not None else 0)

    def record(self, stats: Any, outcome: str) -> None:
        self.requests.labels(outcome=outcome).inc()
        if stats is None:
            return
        self.prompt_tokens.inc(max(stats.prompt_tokens - stats.cached_tokens, 0))
        self.cached_tokens.inc(stats.cached_tokens)
        self.predicted.inc(stats.generated_tokens)
        self.rounds.inc(stats.drafted_rounds)
        self.drafted.inc(stats.proposed)
        self.accepted.inc(stats.accepted)

    def render(self) -> bytes:
        return generate_latest(self.registry)
