"""Token text, bytes and logprobs in each API's shape, `usage`, llama-server's `timings`, SSE
frames: what the routes put in a response, from a finished job or a streamed piece."""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .worker import Result


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet back to bytes (token pieces that are not whole UTF-8). Built on
    first use: by then the tokenizer has imported transformers (importing it earlier prints noise)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}


@dataclass
class ResponseShapes:
    tokenizer: Any

    def token_bytes(self, token_id: int) -> list[int]:
        tok = self.tokenizer
        raw = tok.convert_ids_to_tokens(token_id) if hasattr(tok, "convert_ids_to_tokens") else None
        if isinstance(raw, str):
            try:  # a byte-level BPE token spells its bytes in GPT-2's alphabet
                return list(bytes(_byte_decoder()[c] for c in raw))
            except KeyError:
                pass
        return list(tok.decode([token_id]).encode())

    def piece(self, token_id: int):
        text = self.tokenizer.decode([token_id])
        return self.token_bytes(token_id) if "\ufffd" in text else text  # bytes for part of a character

    def chat_logprobs(self, entries: list) -> dict:
        """OpenAI chat's `logprobs.content`: each token with its bytes and the top alternatives."""

        def one(t: int, lp: float) -> dict:
            return {"token": self.tokenizer.decode([t]), "logprob": lp, "bytes": self.token_bytes(t)}

        return {
            "content": [{**one(e.token, e.logprob), "top_logprobs": [one(t, v) for t, v in e.top]} for e in entries]
        }

    def legacy_logprobs(self, entries: list, offset: int = 0) -> dict:
        """OpenAI completions' `logprobs`: parallel lists, text offsets into the completion."""
        texts = [self.tokenizer.decode([e.token]) for e in entries]
        offsets = []
        for t in texts:
            offsets.append(offset)
            offset += len(t)
        return {
            "tokens": texts,
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{self.tokenizer.decode([t]): v for t, v in e.top} for e in entries],
            "text_offset": offsets,
        }

    def native_probs(self, entries: list, post_sampling: bool = False) -> list:
        """llama-server's `completion_probabilities`: logprobs of the model's distribution, or with
        `post_sampling` probabilities of the sampler's (`prob`, `top_probs`). Those leave out the
        tokens the sampler ruled out (probability 0), as llama-server does: fewer than `n_probs`
        entries then sum to 1."""
        key, top = ("prob", "top_probs") if post_sampling else ("logprob", "top_logprobs")

        def one(t: int, lp: float) -> dict:
            value = math.exp(lp) if post_sampling else lp
            return {"id": t, "token": self.tokenizer.decode([t]), "bytes": self.token_bytes(t), key: value}

        def tops(e) -> list[dict]:
            return [one(t, v) for t, v in e.top if not post_sampling or math.exp(v) > 0]

        return [{**one(e.token, e.logprob), top: tops(e)} for e in entries]


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def sse_event(obj: dict) -> str:
    """A frame named by its object's type (`event:` + `data:`), as Anthropic's and the Responses
    streams send them."""
    return f"event: {obj['type']}\ndata: {json.dumps(obj)}\n\n"


RANDOM_SEED = 4294967295  # llama-server's LLAMA_DEFAULT_SEED: what it reports for a random seed


SAMPLERS_OFF = {
    "typical_p": 1.0,
    "top_n_sigma": -1.0,
    "xtc_probability": 0.0,
    "xtc_threshold": 0.1,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "dry_multiplier": 0.0,
    "dry_base": 1.75,
    "dry_allowed_length": 2,
    "dry_penalty_last_n": -1,
    "mirostat": 0,
    "mirostat_tau": 5.0,
    "mirostat_eta": 0.1,
    "adaptive_target": -1.0,
    "adaptive_decay": 0.9,
    "n_keep": 0,
    "n_discard": 0,
    "min_keep": 0,
}


def generation_settings(job: Any, *, n_probs: int = 0, stream: bool = False, eog: Sequence[int] = ()) -> dict:
    """llama-server's `generation_settings`: the sampling and limits a request decoded with. Its
    `logit_bias` lists `{"bias", "token"}` objects, a ban's -inf as null (nlohmann's JSON for it), and
    with `ignore_eos` the end-of-generation tokens (`eog`) banned, as llama-server adds them."""
    s = job.sampling
    biases = list(s.logit_bias) + ([(t, -math.inf) for t in eog] if job.ignore_eos else [])
    return {
        "seed": RANDOM_SEED if s.seed is None else s.seed,
        "temperature": s.temp,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "repeat_last_n": s.repeat_last_n,
        "repeat_penalty": s.repetition_penalty,
        "n_predict": job.max_tokens,
        "max_tokens": job.max_tokens,
        "stop": list(job.stop),
        "ignore_eos": job.ignore_eos,
        "stream": stream,
        "n_probs": n_probs,
        "logit_bias": [{"bias": b if math.isfinite(b) else None, "token": t} for t, b in biases],
        "grammar": job.grammar.text if job.grammar is not None else "",
        # llama-server's samplers mlxcel-py does not have, at the values that turn them off
        **SAMPLERS_OFF,
        "speculative.n_max": None if job.speculative else 0,
        "speculative.n_min": job.min_draft or 0,
        "t_max_predict_ms": job.predict_ms or -1,
        **({"n_keep": job.shift.keep, "n_discard": job.shift.discard} if job.shift is not None else {}),
    }


def usage(r: Result) -> dict:
    p = r.stats.prompt_tokens
    return {
        "prompt_tokens": p,
        "completion_tokens": r.stats.generated_tokens,
        "total_tokens": p + r.stats.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": r.stats.cached_tokens},
    }


def _figures(cache_n: int, prompt_n: int, prompt_ms: float, pred_n: int, pred_ms: float) -> dict:
    """llama-server's nine `timings` figures from counts and times; the rates count decode steps
    (the first token comes with the prompt's last forward)."""
    return {
        "cache_n": cache_n,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n / (prompt_ms / 1000) if prompt_n and prompt_ms else 0.0,
        "predicted_n": pred_n,
        "predicted_ms": pred_ms,
        "predicted_per_token_ms": pred_ms / (pred_n - 1) if pred_n > 1 else 0.0,
        "predicted_per_second": (pred_n - 1) / (pred_ms / 1000) if pred_n > 1 and pred_ms else 0.0,
    }


def timings(stats: Any, so_far: tuple[int, float] | None = None) -> dict:
    """llama-server's `timings`, plus the drafter's counters when a round drafted. `so_far`:
    (tokens, ms) decoded until now, for a stream's per-token timings (the stats' decode time is
    known at the end)."""
    prompt_n = stats.prompt_tokens - stats.cached_tokens
    prompt_ms = stats.prefill_s * 1000
    pred_n = stats.generated_tokens
    pred_ms = stats.predicted_s * 1000
    if so_far is not None:
        pred_n, pred_ms = so_far
    t = _figures(stats.cached_tokens, prompt_n, prompt_ms, pred_n, pred_ms)
    if stats.drafted_rounds > 0:
        t.update(
            draft_n=stats.proposed,
            draft_n_accepted=stats.accepted,
            draft_rounds=stats.drafted_rounds,
            draft_kind=stats.draft_kind,
        )
    if stats.tree_rounds > 0:  # ours: rounds that verified a draft tree, and took one of its branches
        t.update(draft_tree_rounds=stats.tree_rounds, draft_branch_accepts=stats.branch_accepts)
    return t


class LiveTimings:
    """llama-server's `timings_per_token`: `timings` on every chunk a stream sends, prompt
    progress chunks included, counted as it goes (the final chunk has the finished figures)."""

    def __init__(self, job: Any):
        self.job = job
        self.first: float | None = None  # when the first text piece came: generation time counts from it

    def progress(self, p: tuple) -> dict:
        """While the prompt is fed: (total, cache, processed, ms) as `prompt_progress` has them.
        Before any prompt token is fed the prompt took no time (llama-server's first update)."""
        _, cache, processed, ms = p
        n = processed - cache
        return _figures(cache, n, ms if n > 0 else 0.0, 0, 0.0)

    def piece(self, tokens: int) -> dict | None:
        gen = self.job.generation
        if gen is None:  # already finished: the final chunk carries the timings
            return None
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        return timings(gen.stats, (tokens, (now - self.first) * 1000))
