"""f16 and bf16 KV caches on models whose layers run mlx-lm's code (sliding windows, hybrid and
recurrent families): every plain and sliding KV cache holds its rows at the type asked, in half
float32's bytes, and prompt lookup still equals plain decoding token for token at that type.
q8_0/q4_0 keep f16 there with a note. (Ranks of --tp-size/--pp-size: tests/test_distributed.py.)
"""

from __future__ import annotations

import mlx.core as mx
import pytest
import tiny_models
from test_engine import engine_for, lookup, run
from test_families import copy_prompts

from mlxcel_py.engine.cache import SequenceCache
from mlxcel_py.models import cache_kinds, kv_cache, loading
from mlxcel_py.options import SamplingOptions

# the families of tiny_models with attention caches (Mamba and RWKV-7 keep states only)
WITH_KV = ["gemma3_text", "qwen3_5", "falcon_h1", "lfm2", "recurrent_gemma"]
_loaded: dict = {}


@pytest.fixture(scope="module")
def at_type(tmp_path_factory):
    def get(name: str, types: tuple[str, str]):
        key = (name, types)
        if key not in _loaded:
            folder = tmp_path_factory.mktemp(name) / "model"
            if not folder.exists():
                tiny_models.build(folder, tiny_models.FAMILIES[name], scale=tiny_models.SCALES.get(name))
            _loaded[key] = loading.load(loading.resolve(str(folder)), cache_types=types)
        return _loaded[key]

    return get


def _kv_leaves(cache: SequenceCache) -> list:
    return [c for c in cache_kinds.leaves(cache.layers) if type(c) in cache_kinds.STORABLE]


@pytest.mark.parametrize("name", WITH_KV)
@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_every_kv_cache_holds_the_type_and_half_the_bytes(at_type, name, kind):
    lm, ref = at_type(name, (kind, kind)), at_type(name, ("auto", "auto"))
    dtype = {"f16": mx.float16, "bf16": mx.bfloat16}[kind]
    assert lm.kv_cache == f"{kind} keys, {kind} values" and lm.kv_note is None
    assert ref.kv_cache == "f32 keys, f32 values"
    prompt = copy_prompts(1, seed=3)[0] * 12  # past one 256-row growth step of mlx-lm's buffers
    sizes = {}
    for loaded, want in ((lm, dtype), (ref, mx.float32)):
        cache = SequenceCache(loaded.model)
        cache.prefill(prompt)
        cache.feed([5])  # one-row writes after the block ones (a window's in-place path)
        cache.eval()
        kvs = _kv_leaves(cache)
        assert kvs, name
        assert all(c.keys.dtype == want and c.values.dtype == want for c in kvs)
        sizes[want] = sum(c.keys.nbytes + c.values.nbytes for c in kvs)
    assert sizes[dtype] * 2 == sizes[mx.float32]


@pytest.mark.parametrize("name", WITH_KV)
def test_prompt_lookup_equals_plain_at_f16(at_type, name):
    lm = at_type(name, ("f16", "bf16"))  # keys and values may differ in type
    plain, spec = engine_for(lm), engine_for(lm, lookup("graded", adaptive=False))
    spec.warmup()
    proposed = accepted = 0
    for i, p in enumerate(copy_prompts(4, seed=len(name))):
        s = SamplingOptions() if i % 2 == 0 else SamplingOptions(temp=0.9, seed=i)
        a, _ = run(plain, p, max_tokens=32, sampling=s, ignore_eos=True)
        b, g = run(spec, p, max_tokens=32, sampling=s, ignore_eos=True)
        assert a == b, (name, i)
        proposed, accepted = proposed + g.stats.proposed, accepted + g.stats.accepted
    assert accepted > 0 and proposed > accepted  # accepts and rejects (rollbacks) both ran
    assert all(
        c.keys.dtype == mx.float16 and c.values.dtype == mx.bfloat16 for c in _kv_leaves(spec.sequence_cache(True))
    )


def test_blocks_keep_f16_on_mlx_lm_layers_with_a_note(at_type):
    lm = at_type("gemma3_text", ("q8_0", "auto"))
    assert lm.kv_cache == "f16 keys, f32 values"
    assert lm.kv_note.startswith(
        "--cache-type-k q8_0: q8_0 and q4_0 blocks are written by the fused decoder layers only"
    )
    assert "the cache keeps f16 there" in lm.kv_note


def test_a_restored_cache_keeps_its_type_as_it_grows(at_type):
    # a slot file's caches are mlx-lm's plain objects: store_caches gives them the type again
    from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

    lm = at_type("qwen3_5", ("f16", "f16"))
    cache = SequenceCache(lm.model)
    cache.prefill(list(range(10, 40)))
    cache.eval()
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "c.safetensors")
        save_prompt_cache(path, cache.layers)
        layers = load_prompt_cache(path)
    kv_cache.store_caches(lm.model, layers)
    restored = SequenceCache(lm.model)
    restored.layers, restored.tokens = layers, list(range(10, 40))
    restored.prefill(list(range(300)))  # past the restored buffers' room: mlx-lm grows them
    restored.eval()
    assert all(c.keys.dtype == mx.float16 for c in _kv_leaves(restored))


def test_batched_rows_on_mlx_lm_layers_at_f16_equal_solo_steps(tiny_dir, monkeypatch):
    # a plain-KV family whose layers are not fused: serve's ragged batches write its f16 caches
    # through the batched cache attention, and each row equals its solo step bit for bit
    from mlxcel_py.engine import batch

    monkeypatch.setenv("MLXCEL_NO_FUSED_LAYERS", "1")
    lm = loading.load(loading.resolve(str(tiny_dir)), cache_types=("f16", "f16"))
    monkeypatch.delenv("MLXCEL_NO_FUSED_LAYERS")
    assert lm.kv_cache == "f16 keys, f16 values" and "fused" not in lm.kernels
    assert batch.probe(lm.model, lm.vocab_size).mode == "exact" and batch.ragged(lm.model)
    lengths, blocks = (3, 17, 40), [[5, 6, 7, 8], [9], [10, 11]]
    seqs, solo = [], []
    for n in lengths:
        for pool in (seqs, solo):
            c = SequenceCache(lm.model)
            c.prefill(list(range(20, 20 + n)))
            pool.append(c)
    got = batch.batched_forward(lm.model, seqs, blocks)
    for s, b, g in zip(solo, blocks, got):
        assert (s.feed(b) == g).all().item()
    for c in seqs + solo:
        assert c.layers[0].keys.dtype == mx.float16
