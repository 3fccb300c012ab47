"""The prompt cache across requests (`serve --cache-ram`): prefix reuse, exactness, the byte budget."""

from __future__ import annotations

import pytest

from mlxcel_py.engine.cache import SequenceCache
from mlxcel_py.engine.engine import Engine
from mlxcel_py.engine.prompt_cache import PromptCache, cache_bytes
from mlxcel_py.options import SamplingOptions


def _engine(loaded, pool_bytes=None) -> Engine:
    eng = Engine(loaded.model, eos_ids=loaded.tokenizer.eos_token_ids, vocab_size=loaded.vocab_size)
    if pool_bytes != 0:
        eng.keep_prompts(pool_bytes)
    return eng


def _run(eng, prompt, n=24):
    g = eng.generate(prompt, max_tokens=n, sampling=SamplingOptions(), ignore_eos=True)
    return [e.token for e in g], g.stats


def test_a_shared_prefix_is_reused_and_the_output_is_unchanged(tiny):
    system = list(range(40, 120))
    a, b = system + [5, 6, 7], system + [9, 10, 11, 12]
    fresh = _engine(tiny, 0)
    pooled = _engine(tiny)
    out_a, st_a = _run(pooled, a)
    assert st_a.cached_tokens == 0 and out_a == _run(fresh, a)[0]
    out_b, st_b = _run(pooled, b)
    assert st_b.cached_tokens == len(system)  # the shared system prompt was not prefilled again
    assert out_b == _run(fresh, b)[0]
    # a chat client resending its history plus a new turn: the whole earlier conversation is reused
    turn2 = b + out_b + [20, 21]
    out_c, st_c = _run(pooled, turn2)
    assert st_c.cached_tokens == len(b) + len(out_b) - 1  # the last reply token was never fed
    assert out_c == _run(fresh, turn2)[0]
    assert pooled.prompt_cache.stats.hits == 2


def test_a_request_that_reuses_nothing_takes_a_fresh_cache_and_leaves_the_pool(tiny):
    """reuse_prefix=False (serve's cache_prompt: false): the whole prompt is fed, the stored entry
    sharing its prefix stays in the pool for others (not taken and emptied), no hit is counted,
    and the output is the same."""
    eng = _engine(tiny)
    prompt = list(range(40, 100))
    first, _ = _run(eng, prompt)
    pool = eng.prompt_cache
    before = (pool.entries, pool.stats.hits, pool.stats.reused_tokens)
    g = eng.generate(prompt + [7], max_tokens=24, sampling=SamplingOptions(), ignore_eos=True, reuse_prefix=False)
    taken = next(iter(g))  # the first token: the prompt went in; the request holds its cache
    assert g.stats.cached_tokens == 0
    assert (pool.entries, pool.stats.hits, pool.stats.reused_tokens) == before
    assert [taken.token, *(e.token for e in g)] == _run(_engine(tiny, 0), prompt + [7])[0]
    again, st = _run(eng, prompt)  # the stored prefix is still there for a request that reuses
    assert st.cached_tokens == len(prompt) - 1 and again == first


def test_the_same_prompt_twice_prefills_once_on_the_default_model(real):
    """Exactness on the real model and the row-exact kernel path: a stored prompt continues exactly
    as a fresh one (every token but the last comes from the cache, the last is a one-row step
    either way)."""
    tok = real.tokenizer
    prompt = tok.encode("Rewrite this sentence in the past tense: the dog runs to the park and plays.")
    eng = _engine(real)
    first, st1 = _run(eng, prompt, 32)
    second, st2 = _run(eng, prompt, 32)
    assert st2.cached_tokens == len(prompt) - 1 and st1.cached_tokens == 0
    assert first == second


def test_the_budget_evicts_least_recently_used_and_supersedes_prefixes(tiny):
    eng = _engine(tiny)
    _run(eng, list(range(30, 60)), 4)
    one = eng.prompt_cache.bytes
    assert one > 0 and eng.prompt_cache.entries == 1
    _run(eng, list(range(30, 60)) + [1, 2, 3], 4)  # extends the first: the old entry holds nothing more
    assert eng.prompt_cache.entries == 1
    _run(eng, list(range(100, 130)), 4)
    assert eng.prompt_cache.entries == 2
    small = PromptCache(lambda: SequenceCache(tiny.model), budget_bytes=int(one * 1.5))
    eng.prompt_cache = small
    for start in (10, 60, 110):
        _run(eng, list(range(start, start + 30)), 4)
    assert small.entries == 1 and small.bytes <= small.budget
    assert small.stats.evicted == 2
    kept = small.take(list(range(110, 140)))  # the newest survived
    assert kept.tokens[:30] == list(range(110, 140))
    assert cache_bytes(kept) > 0


def test_a_cancelled_or_failed_request_leaves_no_broken_entry(tiny):
    eng = _engine(tiny)
    g = eng.generate(list(range(50, 90)), max_tokens=50, sampling=SamplingOptions(), ignore_eos=True)
    next(iter(g))
    g.close()  # the consumer stops between tokens: a whole cache, kept
    assert eng.prompt_cache.entries == 1

    calls = {"n": 0}
    real_run = SequenceCache.run

    def failing(self, x):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("boom")
        return real_run(self, x)

    pytest.MonkeyPatch().setattr(SequenceCache, "run", failing)
    try:
        with pytest.raises(RuntimeError):
            _run(eng, list(range(150, 190)), 10)
    finally:
        SequenceCache.run = real_run
    assert eng.prompt_cache.entries == 1  # the failed request's cache was dropped, not stored


def test_cache_bytes_counts_the_allocated_buffers_not_only_the_filled_part(tiny):
    """`--cache-ram` budgets what a kept cache holds in memory: a KV cache grows 256 positions at
    a time, so after 30 tokens it holds 256 positions' worth (mlx-lm's `nbytes`)."""
    cache = SequenceCache(tiny.model)
    cache.feed(list(range(10, 40)))
    cache.eval()
    allocated = sum(c.nbytes for c in cache.layers)
    filled = sum(c.keys[..., : c.offset, :].nbytes + c.values[..., : c.offset, :].nbytes for c in cache.layers)
    assert cache_bytes(cache) == allocated > filled > 0
