"""`/metrics` in Prometheus text format (prometheus_client), one registry per app.

Ours under `mlxcel_` names: requests by outcome, prompt tokens (prefilled and served from the
prompt cache), generated tokens, speculative rounds with the drafted and accepted tokens,
requests processing and waiting, and the prompt cache's size. llama-server's own names too
(`llamacpp:prompt_tokens_total`, `llamacpp:prompt_seconds_total`, `llamacpp:tokens_predicted_total`,
`llamacpp:tokens_predicted_seconds_total`, the two average-throughput gauges,
`llamacpp:n_decode_total`, `llamacpp:n_busy_slots_per_decode`, `llamacpp:requests_processing`,
`llamacpp:requests_deferred`), so dashboards made for llama-server read this server as well.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self, worker: Any, engine: Any):
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
        # llama-server's names and meanings (its `/metrics`)
        self.ll_prompt = Counter("llamacpp:prompt_tokens", "Number of prompt tokens processed.", registry=r)
        self.ll_prompt_s = Counter("llamacpp:prompt_seconds", "Prompt process time", registry=r)
        self.ll_predicted = Counter("llamacpp:tokens_predicted", "Number of generation tokens processed.", registry=r)
        self.ll_predicted_s = Counter("llamacpp:tokens_predicted_seconds", "Predict process time", registry=r)
        self.ll_decode = Counter(
            "llamacpp:n_decode", "Total number of batched forwards (llama_decode() calls).", registry=r
        )
        # running totals for the averages (a gauge reads them when scraped)
        self._totals = {
            "prompt": 0.0,
            "prompt_s": 0.0,
            "predicted": 0.0,
            "predicted_s": 0.0,
            "decodes": 0.0,
            "busy": 0.0,
        }
        t = self._totals
        Gauge("llamacpp:prompt_tokens_seconds", "Average prompt throughput in tokens/s.", registry=r).set_function(
            lambda: t["prompt"] / t["prompt_s"] if t["prompt_s"] > 0 else 0.0
        )
        Gauge(
            "llamacpp:predicted_tokens_seconds", "Average generation throughput in tokens/s.", registry=r
        ).set_function(lambda: t["predicted"] / t["predicted_s"] if t["predicted_s"] > 0 else 0.0)
        Gauge(
            "llamacpp:n_busy_slots_per_decode", "Average number of busy slots per batched forward.", registry=r
        ).set_function(lambda: t["busy"] / t["decodes"] if t["decodes"] else 0.0)
        Gauge("llamacpp:requests_processing", "Number of requests processing.", registry=r).set_function(
            lambda: worker.active
        )
        Gauge("llamacpp:requests_deferred", "Number of requests deferred.", registry=r).set_function(
            lambda: worker.queue_depth
        )
        pool = lambda: engine.prompt_cache  # noqa: E731  (set after the app is built)
        Gauge("mlxcel_prompt_cache_bytes", "Memory held by the prompt cache", registry=r).set_function(
            lambda: pool().bytes if pool() is not None else 0
        )
        Gauge("mlxcel_prompt_cache_entries", "Sequences held by the prompt cache", registry=r).set_function(
            lambda: pool().entries if pool() is not None else 0
        )

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
        prompt, prompt_s = max(stats.prompt_tokens - stats.cached_tokens, 0), max(stats.prefill_s, 0.0)
        predicted_s = max(stats.decode_s, 0.0)
        self.ll_prompt.inc(prompt)
        self.ll_prompt_s.inc(prompt_s)
        self.ll_predicted.inc(stats.generated_tokens)
        self.ll_predicted_s.inc(predicted_s)
        t = self._totals
        t["prompt"] += prompt
        t["prompt_s"] += prompt_s
        t["predicted"] += stats.generated_tokens
        t["predicted_s"] += predicted_s

    def forward(self, slots: int) -> None:
        """One batched forward (or one sequence's) served `slots` requests."""
        self.ll_decode.inc()
        self._totals["decodes"] += 1
        self._totals["busy"] += slots

    def render(self) -> bytes:
        return generate_latest(self.registry)
