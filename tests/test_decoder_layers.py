"""The fused decoder layers (models/decoder_layers.py, csrc/layer_kernel.cpp): one op a layer for
the llama family on the row-exact kernel path.

The reference is mlx-lm's own layer code on the same kernel weights: the fused op must give the
same logits bit for bit (its RMSNorm is MLX's arithmetic, the rest the same kernels), in decode
steps, verify blocks and batched steps alike.
"""

from __future__ import annotations

import contextlib
import json

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache
from tiny_models import build

from mlxcel_py.cpu import extension as cpu_extension
from mlxcel_py.engine import batch
from mlxcel_py.engine.cache import SequenceCache
from mlxcel_py.engine.tree import merge
from mlxcel_py.models import decoder_layers, loading
from mlxcel_py.models.taps import layer_tap

QMM, WHY = cpu_extension.kernel_status()
needs_kernel = pytest.mark.skipif(QMM is None, reason=f"row-exact kernel: {WHY}")

BASE = dict(
    hidden_size=128,
    num_hidden_layers=2,
    intermediate_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    vocab_size=260,
    max_position_embeddings=2048,
    rope_theta=10000.0,
    tie_word_embeddings=True,
)
CONFIGS = {
    "llama": dict(BASE, model_type="llama"),
    "mistral": dict(BASE, model_type="llama", tie_word_embeddings=False),  # config says mistral: see family()
    "qwen2": dict(BASE, model_type="qwen2"),  # q/k/v biases
    "qwen3": dict(BASE, model_type="qwen3", head_dim=32),  # per-head q/k norms
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    out = {}
    for name, cfg in CONFIGS.items():
        folder = build(tmp_path_factory.mktemp(name) / "model", cfg, seed=3, scale=1.0)
        if name == "mistral":  # mlx-lm runs mistral checkpoints with its llama module
            raw = json.loads((folder / "config.json").read_text())
            (folder / "config.json").write_text(json.dumps(dict(raw, model_type="mistral")))
        out[name] = folder
    return out


# every test runs at each KV cache type the fused layers keep (--cache-type-k/-v): the default
# float16, bfloat16, q8_0 and q4_0 (each rounded once, when a row is written) and float32
KV_TYPES = {"f16": mx.float16, "f32": mx.float32, "bf16": mx.bfloat16, "q8_0": mx.int8, "q4_0": mx.uint8}
ROW_BYTES = {mx.int8: 34, mx.uint8: 18}  # a head's row of 32 values: q8_0's 32 int8, q4_0's 16 bytes; a scale


def _loaded(folders, param):
    name, cache_type = param
    return name, loading.load(loading.resolve(str(folders[name])), cache_types=(cache_type, cache_type))


@pytest.fixture(scope="module", params=[(f, t) for f in sorted(CONFIGS) for t in KV_TYPES], ids="-".join)
def family(request, folders):
    return _loaded(folders, request.param)


# the types mlx-lm's layer code writes too (q8_0 and q4_0 blocks are written by the fused op only:
# mlx-lm's code keeps such a model's rows in float32 and rounds them as its attention reads them)
@pytest.fixture(scope="module", params=[(f, t) for f in sorted(CONFIGS) for t in ("f16", "f32", "bf16")], ids="-".join)
def float_family(request, folders):
    return _loaded(folders, request.param)


def _greedy_logits(model, prompt: list[int], n: int) -> tuple[list[int], mx.array]:
    cache = SequenceCache(model)
    logits = cache.feed(prompt)
    rows, tokens = [logits[-1]], []
    for _ in range(n):
        tokens.append(int(mx.argmax(logits[-1]).item()))
        logits = cache.feed([tokens[-1]])
        rows.append(logits[-1])
    return tokens, mx.stack(rows)


@needs_kernel
def test_every_family_fuses_and_equals_mlx_lm_layers_bit_for_bit(family):
    name, loaded = family
    assert decoder_layers.why_not(loaded.model) is None
    assert decoder_layers.fused(loaded.model), name
    assert "2 fused decoder layers" in loaded.kernels
    prompt = list(range(40, 90))  # prefill in chunks, then steps
    tokens, fused = _greedy_logits(loaded.model, prompt, 24)
    with decoder_layers.unfused(loaded.model):
        ref_tokens, ref = _greedy_logits(loaded.model, prompt, 24)
    assert tokens == ref_tokens
    assert mx.array_equal(fused, ref).item(), f"{name}: max diff {mx.abs(fused - ref).max().item()}"


@needs_kernel
def test_the_cache_holds_the_chosen_type_whichever_code_wrote_it(family):
    _, loaded = family
    want = KV_TYPES[loaded.kv_cache.split()[0]]
    row = ROW_BYTES.get(want, 32 * want.size)
    assert loaded.kv_bytes_per_token == 2 * 2 * 2 * row  # layers x (k, v) x kv heads x a head's row
    fused = SequenceCache(loaded.model)
    fused.feed(list(range(40, 90)))  # the op's own buffers
    wide = SequenceCache(loaded.model)
    wide.feed(list(range(300)))  # wider than the op takes at once: consecutive chunks through it
    for c in (fused, wide):
        assert {(kv.keys.dtype, kv.values.dtype) for kv in c.layers} == {(want, want)}
        assert c.layers[0].keys.shape[-1] == (ROW_BYTES.get(want, 32))
    with decoder_layers.unfused(loaded.model):  # mlx-lm's layer code: q8_0/q4_0 rows stay float32 there
        ref = SequenceCache(loaded.model)
        ref.feed(list(range(40, 90)))
    assert ref.layers[0].keys.dtype == (mx.float32 if want in ROW_BYTES else want)


@needs_kernel
@pytest.mark.parametrize("types", [("f16", "f32"), ("q8_0", "f16"), ("bf16", "q8_0"), ("q8_0", "q4_0")], ids="-".join)
def test_keys_and_values_may_differ_in_type(folders, types):
    loaded = loading.load(loading.resolve(str(folders["llama"])), cache_types=types)  # -ctk K -ctv V
    assert loaded.kv_cache == f"{types[0]} keys, {types[1]} values"
    prompt = list(range(40, 90))
    tokens, fused = _greedy_logits(loaded.model, prompt, 12)
    with decoder_layers.unfused(loaded.model):
        ref_tokens, ref = _greedy_logits(loaded.model, prompt, 12)
    assert tokens == ref_tokens and mx.array_equal(fused, ref).item()
    c = SequenceCache(loaded.model)
    c.feed(prompt)
    assert (c.layers[0].keys.dtype, c.layers[0].values.dtype) == tuple(KV_TYPES[t] for t in types)


@needs_kernel
def test_a_verify_block_equals_its_decode_steps_bit_for_bit(family):
    _, loaded = family
    prompt, block = list(range(60, 100)), [7, 99, 120, 3, 250, 18, 64, 65]
    steps = SequenceCache(loaded.model)
    steps.feed(prompt)
    one_by_one = mx.stack([steps.feed([t])[0] for t in block])
    whole = SequenceCache(loaded.model)
    whole.feed(prompt)
    assert mx.array_equal(whole.feed(block), one_by_one).item()


@needs_kernel
def test_batched_rows_through_the_fused_layers_equal_solo_steps(family):
    _, loaded = family
    model = loaded.model
    assert batch.ragged(model)
    prompts = [list(range(30, 30 + n)) for n in (5, 17, 40)]
    blocks = [[11], [12, 13, 14], [15]]  # a verify block beside plain steps
    solo = []
    for p, b in zip(prompts, blocks):
        c = SequenceCache(model)
        c.feed(p)
        solo.append(c.feed(b))
    seqs = []
    for p in prompts:
        c = SequenceCache(model)
        c.feed(p)
        seqs.append(c)
    got = batch.batched_forward(model, seqs, blocks)
    for g, s in zip(got, solo):
        assert mx.array_equal(g, s).item()
    # and the caches hold what solo feeding would: the next step agrees too
    nxt = [c.feed([21])[0] for c in seqs]
    for p, b, n in zip(prompts, blocks, nxt):
        c = SequenceCache(model)
        c.feed(p + b)
        assert mx.array_equal(c.feed([21])[0], n).item()


@needs_kernel
def test_a_rollback_then_continue_matches_a_fresh_sequence(family):
    _, loaded = family
    model = loaded.model
    c = SequenceCache(model)
    c.feed(list(range(40, 80)))
    c.mark()
    c.feed([5, 6, 7, 8, 9])
    assert c.truncate(42)  # keep 2 of the 5: a trim of the fused layers' buffers
    c.release()
    after = c.feed([100])
    fresh = SequenceCache(model)
    fresh.feed(list(range(40, 80)) + [5, 6])
    assert mx.array_equal(after, fresh.feed([100])).item()


@needs_kernel
def test_the_op_refuses_bad_shapes_and_positions_with_a_message(family):
    _, loaded = family
    model = loaded.model
    op = decoder_layers._FUSED[id(model.model)][0].op
    k = mx.zeros((1, 2, 256, 32))
    h = mx.zeros((1, 3, 128))
    with pytest.raises(ValueError, match="one sequence and position per row"):
        op(h, [k], [k], [0, 0], [0, 1])
    with pytest.raises(ValueError, match="no room at its position"):
        op(h, [k], [k], [0, 0, 0], [254, 255, 256])
    with pytest.raises(ValueError, match="rows must hold 32 key and 32 value elements"):
        op(h, [mx.zeros((1, 2, 256, 16))], [k], [0, 0, 0], [0, 1, 2])
    with pytest.raises(ValueError, match="rows must hold 34 key"):  # a q8_0 row carries its scales
        op(h, [k.astype(mx.int8)], [k], [0, 0, 0], [0, 1, 2])
    with pytest.raises(ValueError, match=r"float32, float16, bfloat16, int8 \(q8_0\) or uint8"):
        op(h, [k.astype(mx.int32)], [k], [0, 0, 0], [0, 1, 2])
    with pytest.raises(ValueError, match="h must be float32"):
        op(mx.zeros((1, 3, 64)), [k], [k], [0, 0, 0], [0, 1, 2])


# ---- draft trees (engine/tree.py): tree rows in the same op --------------------------------------
TREE = merge([[5, 6, 7, 8], [5, 9, 10], [11, 12], [5, 6, 13], [14]])  # a trie: chain, then branches


def _path_steps(model, context: list[int], path: list[int]) -> mx.array:
    """The logits of the path's last token, fed one token at a time after `context`."""
    c = SequenceCache(model)
    c.prefill(context[:-1])
    for t in [context[-1], *path][:-1]:
        c.feed([t])
    return c.feed([[context[-1], *path][-1]])[0]


@needs_kernel
@pytest.mark.parametrize("context_len", [40, 1300])  # 1300: the prefix in two key chunks (KEY_CHUNK)
def test_tree_rows_equal_their_paths_one_token_steps_bit_for_bit(family, context_len):
    """Every node of a draft tree verified in one forward gives the logits of the one-token step
    of its own path: its ancestors' keys only, at its depth's position."""
    _tree_rows_equal_path_steps(family[1], True, context_len)


@needs_kernel
@pytest.mark.parametrize("context_len", [40, 1300])
def test_tree_rows_through_mlx_lm_layers_equal_their_paths_steps(float_family, context_len):
    """The same through mlx-lm's layers over the batched cache attention."""
    _tree_rows_equal_path_steps(float_family[1], False, context_len)


def _tree_rows_equal_path_steps(loaded, fused: bool, context_len: int) -> None:
    model, context = loaded.model, [60 + i % 190 for i in range(context_len)]
    with contextlib.nullcontext() if fused else decoder_layers.unfused(model):
        c = SequenceCache(model)
        c.prefill(context[:-1])
        got = batch.batched_forward(model, [c], [[context[-1], *TREE.tokens]], trees=[TREE])[0]
        for row in range(len(TREE) + 1):
            path = [TREE.tokens[n] for n in TREE.path(row - 1)] if row else []
            assert mx.array_equal(got[row], _path_steps(model, context, path)).item(), (row, path)


@needs_kernel
def test_a_tree_round_leaves_the_cache_a_chain_of_its_path_leaves(family):
    """The accepted path runs through branches (not the tree's first chain): its rows move down
    after the root, and the cache (keys, values, tokens, offset) equals one fed that chain."""
    from mlxcel_py.engine.sampling import Decider
    from mlxcel_py.engine.verify import judge_tree
    from mlxcel_py.options import SamplingOptions

    _, loaded = family
    model, context = loaded.model, list(range(60, 100))
    greedy, _ = _greedy_logits(model, context, 3)  # g1 g2 g3: what the target picks
    g1, g2, g3 = greedy
    wrong = [t for t in range(200, 260) if t not in greedy]
    tree = merge([[wrong[0], wrong[1]], [g1, wrong[2]], [g1, g2, wrong[3]], [wrong[4]]])
    assert not tree.is_chain and tree.tokens[0] != g1
    tap = layer_tap(model, (1,))  # a drafter's tap (DFlash): its rows follow the path too
    c = SequenceCache(model)
    c.keep_hidden(tap)
    c.feed(context[:-1])
    logits = batch.batched_forward(model, [c], [[context[-1], *tree.tokens]], trees=[tree])[0]
    verdict = judge_tree(c, context, tree, Decider(SamplingOptions(), prompt_len=len(context)), logits)
    assert verdict.tokens == [g1, g2, g3] and verdict.accepted == 2
    chain = SequenceCache(model)
    chain.keep_hidden(tap)
    chain.feed(context + [g1, g2])
    assert c.tokens == chain.tokens
    assert c.hidden_start == chain.hidden_start == 0
    assert mx.array_equal(c.hidden, chain.hidden).item()
    for a, b in zip(c.layers, chain.layers):
        assert a.offset == b.offset == len(context) + 2
        assert mx.array_equal(a.keys[..., : a.offset, :], b.keys[..., : b.offset, :]).item()
        assert mx.array_equal(a.values[..., : a.offset, :], b.values[..., : b.offset, :]).item()
    assert mx.array_equal(c.feed([g3]), chain.feed([g3])).item()  # and the next step agrees


@needs_kernel
def test_tree_rows_and_row_moves_refuse_bad_rows_with_a_message(family):
    _, loaded = family
    op = decoder_layers._FUSED[id(loaded.model.model)][0].op
    k = mx.zeros((1, 2, 256, 32))
    h = mx.zeros((1, 2, 128))
    rows = dict(slot=[0, 1], base=[1, 1], tail=[[], [1]])
    op(h, [k], [k], [0, 0], [0, 1], **rows)  # well-formed
    with pytest.raises(ValueError, match="slot is outside its buffer"):
        op(h, [k], [k], [0, 0], [0, 1], **dict(rows, slot=[0, 256]))
    with pytest.raises(ValueError, match="tail must be increasing"):
        op(h, [k], [k], [0, 0], [0, 1], **dict(rows, tail=[[], [1, 1]]))
    with pytest.raises(ValueError, match="tail must be increasing"):
        op(h, [k], [k], [0, 0], [0, 1], **dict(rows, tail=[[], [300]]))
    with pytest.raises(ValueError, match="slot, base and tail together"):
        op(h, [k], [k], [0, 0], [0, 1], slot=[0, 1])
    with pytest.raises(ValueError, match="a slot, a base and a tail for every row"):
        op(h, [k], [k], [0, 0], [0, 1], **dict(rows, base=[1]))
    with pytest.raises(ValueError, match="rows must be increasing"):
        QMM.move_rows([k], [5, 4], 2)
    with pytest.raises(ValueError, match="rows must be increasing"):
        QMM.move_rows([k], [1], 2)  # a row can only move down


@needs_kernel
def test_move_rows_moves_rows_down_in_place_like_a_gather():
    buf = mx.random.normal((1, 2, 64, 8))
    rows, first = [12, 15, 20], 10
    want = mx.array(buf)
    want[..., first : first + 3, :] = buf[..., mx.array(rows), :]
    mx.eval(want)
    (got,) = QMM.move_rows([buf], rows, first)
    assert mx.array_equal(got, want).item()


@needs_kernel
def test_other_caches_and_input_embeddings_take_mlx_lm_code(family):
    _, loaded = family
    model = loaded.model
    from mlxcel_py.cpu import kernels as cpu_kernels

    ids = mx.array([list(range(40, 50))])
    with cpu_kernels.engaged(model):
        a = model(ids, cache=[KVCache() for _ in model.layers])
        with decoder_layers.unfused(model):
            b = model(ids, cache=[KVCache() for _ in model.layers])
        c = model(ids)  # no cache: mlx-lm's forward (a causal mask over the block)
    assert mx.array_equal(a, b).item()
    # no cache: mlx-lm's forward over float32 keys (q8_0's rounding moves the logits more)
    assert mx.allclose(a, c, atol={"q8_0": 0.1, "q4_0": 1.0}.get(loaded.kv_cache.split()[0], 1e-3)).item()


@needs_kernel
def test_families_outside_the_list_say_why_and_are_not_fused(tmp_path):
    from tiny_models import FAMILIES

    folder = build(tmp_path / "g", FAMILIES["gemma3_text"], seed=1)
    loaded = loading.load(loading.resolve(str(folder)))
    assert not decoder_layers.fused(loaded.model)
    assert decoder_layers.why_not(loaded.model)


@needs_kernel
def test_a_tensor_parallel_ranks_layers_are_not_fused(tmp_path, monkeypatch):
    """A rank whose linears gather rows from the other ranks (parallel.exact_tp.GatheredRows)
    talks to them mid-layer: its layers keep mlx-lm's code, and why_not says so."""
    from mlxcel_py.parallel.exact_tp import GatheredRows

    loaded = loading.load(loading.resolve(str(build(tmp_path / "m", CONFIGS["llama"], seed=3, scale=1.0))))
    attn = loaded.model.model.layers[1].self_attn
    monkeypatch.setattr(attn, "o_proj", GatheredRows(attn.o_proj, group=None))
    assert "tensor-parallel rank" in decoder_layers.why_not(loaded.model)


def test_turned_off_by_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXCEL_NO_FUSED_LAYERS", "1")
    folder = build(tmp_path / "m", CONFIGS["llama"], seed=3, scale=1.0)
    loaded = loading.load(loading.resolve(str(folder)))
    assert not decoder_layers.fused(loaded.model)
    assert "fused" not in loaded.kernels


@needs_kernel
@pytest.mark.real
def test_default_model_fused_equals_mlx_lm_layers_bit_for_bit(real):
    assert decoder_layers.fused(real.model)
    prompt = real.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 4)
    tokens, fused = _greedy_logits(real.model, prompt, 16)
    with decoder_layers.unfused(real.model):
        ref_tokens, ref = _greedy_logits(real.model, prompt, 16)
    assert tokens == ref_tokens and mx.array_equal(fused, ref).item()


def test_kept_tap_rows_cut_and_windowed_match_the_rows_of_one_forward(family):
    """A drafter's tap rows kept one forward at a time (parts joined only when read): rollbacks
    cut them without joining, and a window (`keep_hidden(tap, window)`) lets the oldest go, never
    the newest `window`; what is left equals the rows one forward over the same tokens gives."""
    _, loaded = family
    model = loaded.model
    tap = layer_tap(model, (1,))
    tokens = list(range(60, 100))
    whole = SequenceCache(model)
    whole.keep_hidden(tap)
    whole.feed(tokens)
    windowed = SequenceCache(model)
    windowed.keep_hidden(tap, window=6)
    windowed.feed(tokens[:4])
    for i in range(4, len(tokens), 2):
        windowed.feed(tokens[i : i + 2] + [7])  # a verify block whose last row is rejected
        assert windowed.truncate(i + 2)
        kept = windowed.hidden.shape[0]
        assert 6 <= kept <= 2 * 6 + 2 and windowed.hidden_start + kept == i + 2, (i, kept)
    start = windowed.hidden_start
    assert start > 0  # the oldest rows went
    got, want = windowed.hidden_rows(start, len(tokens)), whole.hidden_rows(start, len(tokens))
    assert mx.allclose(got, want, atol=1e-5).item()
