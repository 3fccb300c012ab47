"""GGUF import (#19): every tensor type llama.cpp writes, the main architectures, atomic caching.

Files are written by `gguf_files` the way llama.cpp's converter writes them (gguf-py's name map,
its Q/K permutation and Gemma's norm offset). Each is checked three ways: the imported weights
equal gguf-py's own decoding of the file (exactly where gguf-py decodes, to float rounding where MLX
reads the type itself); greedy output of the import equals the same weights loaded as an mlx-lm
folder built with the test's own config; the tokenizer maps every vocabulary entry to its id.
"""

from __future__ import annotations

import shutil
import time

import gguf_files
import mlx.core as mx
import numpy as np
import pytest
from gguf_files import DECODED, NATIVE, Q
from test_engine import engine_for, run

from mlxcel_py.errors import ModelError
from mlxcel_py.models import loading
from mlxcel_py.models.gguf import convert as importer

FAMILIES = list(gguf_files.CONFIGS)
PROMPT = [5, 17, 99, 3, 250, 42, 42, 7, 120, 64, 9, 33]


def _imported(folder) -> dict[str, np.ndarray]:
    w = mx.load(str(folder / "model.safetensors"))
    out = {}
    for k, v in w.items():
        if k.endswith((".scales", ".biases")):
            continue
        base = k.rsplit(".", 1)[0]
        if k.endswith(".weight") and f"{base}.scales" in w:
            v = mx.dequantize(
                v,
                w[f"{base}.scales"],
                w[f"{base}.biases"],
                group_size=32,
                bits=v.shape[-1] * 32 // (w[f"{base}.scales"].shape[-1] * 32),
            )
        out[k] = np.array(v.astype(mx.float32))
    return out


def _greedy(folder) -> list[int]:
    # float32 both sides: the import's weights are under test, not the kernels' arithmetic (auto
    # keeps the file's quantized layers quantized, with int8 activations, and the reference's float)
    lm = loading.load(loading.resolve(str(folder)), cpu_weights="f32")
    toks, _ = run(engine_for(lm), PROMPT, max_tokens=16)
    return toks


@pytest.mark.parametrize("kinds", ["decoded", "native"])
@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_imports_like_the_same_weights_as_a_folder(tmp_path, family, kinds):
    path = tmp_path / f"{family}.gguf"
    _, own, names = gguf_files.write(path, family, DECODED if kinds == "decoded" else NATIVE)
    # the decoders' float32 output as it is (the CPU default re-quantizes it to 8 bits: below)
    folder = importer.convert(path, tmp_path / "converted", for_cpu=True, keep_decoded=True)
    want = gguf_files.expected(path, family, names)
    got = _imported(folder)
    assert set(got) == set(want)
    for name, value in want.items():
        if kinds == "decoded":  # gguf-py decoded these: bit for bit
            assert np.array_equal(got[name], value), name
        else:  # MLX's affine dequantization (scale * q + bias) rounds differently from d * (q - 8)
            np.testing.assert_allclose(
                got[name], value, rtol=0, atol=1e-6 * max(1.0, np.abs(value).max()), err_msg=name
            )
    # the file holds the model's weights up to quantization (catches a wrong name or layout that
    # would otherwise be undone the same way by the expected-weights reader)
    if kinds == "native":
        for name, value in own.items():
            if value.ndim >= 2:
                assert np.corrcoef(want[name].ravel(), value.ravel())[0, 1] > 0.9, name
    reference = gguf_files.reference_folder(tmp_path / "reference", family, want, folder)
    assert _greedy(folder) == _greedy(reference)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_tokenizer_round_trips_the_vocabulary(tmp_path, family):
    from tokenizers import Tokenizer

    path = tmp_path / "m.gguf"
    gguf_files.write(path, family, [Q.F16])
    folder = importer.convert(path, tmp_path / "converted")
    md = importer.metadata(importer.read(path))
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokens = md["tokenizer.ggml.tokens"]
    assert tok.get_vocab_size() == len(tokens)
    assert [tok.token_to_id(t) for t in tokens] == list(range(len(tokens)))
    text = "the theme: ünï 9"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids).strip() == text
    merged = "Ġthe" if family == "llama" else "▁the"
    assert tokens.index(merged) in tok.encode(" the", add_special_tokens=False).ids


def test_a_whole_prompt_gets_the_bos_llama_cpp_adds_and_a_named_template_too(tmp_path):
    """llama.cpp puts BOS before a sentencepiece vocabulary's prompt unless the file says not to
    (a byte-level BPE one here says nothing: none); a llama-server named format, which prints no
    BOS, gets it as llama-server gives it; a template printing bos_token still has exactly one."""
    from mlxcel_py.commands._options import build_options
    from mlxcel_py.formats.prompting import prompt_ids, render_messages
    from mlxcel_py.session import open_session
    from mlxcel_py.validate import validate

    for family, bos in (("gemma3", 2), ("llama", None)):
        path = tmp_path / f"{family}.gguf"
        gguf_files.write(path, family, [Q.F16])
        tok = loading.load(loading.resolve(str(path))).tokenizer
        plain = tok.encode("hi there", add_special_tokens=False)
        assert prompt_ids(tok, "hi there", chat_template=False) == ([bos] if bos else []) + plain
    hi = [{"role": "user", "content": "hi"}]
    for template, first in (("llama2", "[INST]"), ("{{ bos_token }}<{{ messages[0]['content'] }}>", "<hi>")):
        opts = {"prompt": "x", "model": str(tmp_path / "gemma3.gguf"), "chat_template": template}
        s = open_session(validate(build_options("generate", opts)))
        ids = render_messages(s.tokenizer, hi)
        assert ids[0] == 2 and 2 not in ids[1:], ids
        assert s.tokenizer.decode(ids[1:]).startswith(first)


def _k_quant_import(tmp_path, for_cpu: bool):
    """A qwen3 file of Q4_K, Q6_K and F16 tensors, converted: (file, names, folder, config, weights, expected)."""
    path = tmp_path / "m.gguf"
    _, _, names = gguf_files.write(path, "qwen3", [Q.Q4_K, Q.Q6_K, Q.F16])
    folder = importer.convert(path, tmp_path / "converted", for_cpu=for_cpu)
    cfg = gguf_files.read_json(folder / "config.json")
    w = mx.load(str(folder / "model.safetensors"))
    return path, names, folder, cfg, w, gguf_files.expected(path, "qwen3", names)


def test_k_quants_are_requantized_for_metal_and_cuda(tmp_path):
    _, _, folder, cfg, w, want = _k_quant_import(tmp_path, for_cpu=False)
    quantized = {k.rsplit(".", 1)[0] for k in w if k.endswith(".scales")}
    assert quantized and cfg["quantization"]["group_size"] == 32
    bits = {m: cfg["quantization"].get(m, {}).get("bits", cfg["quantization"]["bits"]) for m in quantized}
    assert set(bits.values()) == {4, 8}  # Q4_K -> 4-bit, Q6_K -> 8-bit
    for module in quantized:
        approx = mx.dequantize(
            w[f"{module}.weight"], w[f"{module}.scales"], w[f"{module}.biases"], group_size=32, bits=bits[module]
        )
        exact = want[f"{module}.weight"]
        step = (exact.max() - exact.min()) / (2 ** bits[module] - 1)
        assert np.abs(np.array(approx) - exact).max() <= step  # within one quantization step
    lm = loading.load(loading.resolve(str(folder)), dequantize=False)
    assert lm.dtype.startswith("quantized")
    assert len(run(engine_for(lm), PROMPT, max_tokens=4)[0]) == 4


def test_other_k_quants_are_stored_8_bit_on_the_cpu(tmp_path):
    """Q6_K (a type the kernels do not read) goes into the cache as MLX 8-bit in groups of 32:
    bit for bit what the kernel made of its float32 decoding at load before, a quarter the bytes."""
    path, names, folder, cfg, w, want = _k_quant_import(tmp_path, for_cpu=True)
    kinds = {t.name: t.tensor_type for t in importer.read(path).tensors}
    q6k = [names[n].rsplit(".", 1)[0] for n, k in kinds.items() if k == Q.Q6_K and n.endswith(".weight")]
    assert q6k
    for module in q6k:
        assert cfg["quantization"].get(module, {}).get("bits", cfg["quantization"]["bits"]) == 8
        wq, s, b = mx.quantize(mx.array(want[f"{module}.weight"]), group_size=32, bits=8)
        assert all(
            mx.array_equal(w[f"{module}.{p}"], v).item() for p, v in zip(("weight", "scales", "biases"), (wq, s, b))
        )
    lm = loading.load(loading.resolve(str(folder)))
    assert lm.weights.bits == (4, 8) and lm.weights.forms == ("f16",)  # Q4_K, Q6_K; the F16 tensors as stored
    assert len(run(engine_for(lm), PROMPT, max_tokens=4)[0]) == 4


def test_q4_k_blocks_become_4_bit_affine_layers_directly(tmp_path):
    """Q4_K is affine 4-bit in groups of 32: on the CPU its layers are stored as MLX 4-bit (for the
    row-exact kernel) instead of float32 re-quantized to 8 bits, and decode to gguf-py's values."""
    path, names, folder, cfg, w, want = _k_quant_import(tmp_path, for_cpu=True)
    kinds = {t.name: t.tensor_type for t in importer.read(path).tensors}
    q4k = [names[n].rsplit(".", 1)[0] for n, k in kinds.items() if k == Q.Q4_K and n.endswith(".weight")]
    assert q4k
    for module in q4k:
        bits = cfg["quantization"].get(module, {}).get("bits", cfg["quantization"]["bits"])
        assert bits == 4 and w[f"{module}.scales"].dtype == mx.float32
        got = mx.dequantize(w[f"{module}.weight"], w[f"{module}.scales"], w[f"{module}.biases"], group_size=32, bits=4)
        assert np.array_equal(np.array(got), want[f"{module}.weight"]), module
    lm = loading.load(loading.resolve(str(folder)))
    assert len(run(engine_for(lm), PROMPT, max_tokens=4)[0]) == 4


def _raw_gguf(path, arch="llama", tensors=None):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", 1)
    for name, (data, qtype) in (tensors or {}).items():
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_refusals_name_what_is_wrong(tmp_path):
    with pytest.raises(ModelError, match=r"architecture 'mamba' is not supported; supported: llama, qwen2, qwen3"):
        importer.convert(_raw_gguf(tmp_path / "a.gguf", "mamba"), tmp_path / "out")
    bad = {"token_embd.weight": (np.zeros((4, 40), np.uint8), Q.Q8_1)}  # no decoder anywhere
    with pytest.raises(ModelError, match=r"tensor token_embd.weight has type Q8_1, which neither MLX nor gguf-py"):
        importer.convert(_raw_gguf(tmp_path / "b.gguf", tensors=bad), tmp_path / "out")
    odd = {"blk.0.attn_sinks.weight": (np.zeros(4, np.float32), None)}
    with pytest.raises(ModelError, match=r"1 tensor\(s\) this importer does not map for 'llama' \(blk.0.attn_sinks"):
        importer.convert(_raw_gguf(tmp_path / "c.gguf", tensors=odd), tmp_path / "out")
    (tmp_path / "d.gguf").write_bytes(b"GGUF\x03\x00\x00\x00truncated")
    with pytest.raises(ModelError, match=r"d.gguf: cannot read as GGUF"):
        importer.convert(tmp_path / "d.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_interrupted_conversion_leaves_no_usable_entry(tmp_path, monkeypatch):
    path = tmp_path / "m.gguf"
    gguf_files.write(path, "qwen2", [Q.Q8_0])
    cache = tmp_path / "cache"
    out = importer.converted_dir(path, cache)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(importer.gguf_tokenizer, "tokenizer_config", interrupted)  # after the weights are written
    with pytest.raises(KeyboardInterrupt):
        importer.ensure_converted(path, cache)
    assert not out.exists() and list(out.parent.iterdir()) == []
    monkeypatch.undo()
    # a folder without the completion marker (e.g. left by an older version, or copied half-way) is redone
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")
    stale_tmp = out.with_name(out.name + ".tmp999999999")
    stale_tmp.mkdir()
    assert importer.ensure_converted(path, cache) == out
    assert (out / importer.COMPLETE).is_file() and (out / "model.safetensors").is_file()
    assert not stale_tmp.exists()
    first = (out / "model.safetensors").stat().st_mtime_ns
    importer.ensure_converted(path, cache)  # a complete entry is re-used as it is
    assert (out / "model.safetensors").stat().st_mtime_ns == first
    shutil.rmtree(cache)


def test_block_scales_are_float32_for_the_cpu_and_half_elsewhere(tmp_path):
    path = tmp_path / "m.gguf"
    gguf_files.write(path, "qwen2", [Q.Q8_0, Q.Q4_0])
    for for_cpu, dtype in ((True, mx.float32), (False, mx.float16)):
        folder = importer.convert(path, tmp_path / f"converted-{for_cpu}", for_cpu=for_cpu)
        scales = [
            v for k, v in mx.load(str(folder / "model.safetensors")).items() if k.endswith((".scales", ".biases"))
        ]
        assert scales and all(v.dtype == dtype for v in scales)


def test_a_gguf_whose_metadata_disagrees_is_refused_then_its_repair_is_converted_anew(tmp_path):
    """It used to be converted, marked complete and fail at every load, and after the file was
    repaired in place (same name, size and mtime) the broken conversion was still used."""
    import os

    from mlxcel_py.models import loading

    path = tmp_path / "m.gguf"
    cfg, _, _ = gguf_files.write(path, "llama", [Q.Q8_0], metadata={"feed_forward_length": 999})
    cache = tmp_path / "cache"
    with pytest.raises(ModelError, match=r"m.gguf: its metadata does not match its tensors"):
        importer.ensure_converted(path, cache)
    assert list((cache / "gguf").iterdir()) == []  # nothing half-made is kept
    broken = path.stat()
    gguf_files.write(path, "llama", [Q.Q8_0])  # repaired: same name and size...
    os.utime(path, ns=(broken.st_atime_ns, broken.st_mtime_ns))  # ...and mtime
    assert path.stat().st_size == broken.st_size and path.stat().st_mtime_ns == broken.st_mtime_ns
    out = importer.ensure_converted(path, cache)
    assert (out / importer.COMPLETE).is_file()
    assert loading.load(loading.resolve(str(out))).config["intermediate_size"] == cfg["intermediate_size"]


def test_cache_ls_rm_and_the_size_limit(tmp_path, cli_env, monkeypatch):
    import os
    import subprocess

    from conftest import mlxcel_cmd

    cache = tmp_path / "cache"
    monkeypatch.setenv("MLXCEL_CACHE_DIR", str(cache))
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    gguf_files.write(a, "llama", [Q.Q8_0])
    gguf_files.write(b, "qwen2", [Q.Q8_0], seed=1)
    first = importer.ensure_converted(a, cache)
    env = {**cli_env, "MLXCEL_CACHE_DIR": str(cache)}
    ls = subprocess.run(mlxcel_cmd() + ["cache", "ls"], capture_output=True, text=True, env=env, timeout=120)
    assert ls.returncode == 0 and ls.stdout.split("\t")[0] == first.name and str(a) in ls.stdout
    assert "1 conversion(s)" in ls.stderr
    # over the limit, the least recently used conversion goes (not the new one)
    old = time.time() - 3600
    os.utime(first / importer.COMPLETE, (old, old))
    from mlxcel_py.models.gguf import cache as conversions

    size = conversions.entries()[0].bytes
    monkeypatch.setenv("MLXCEL_CACHE_MAX_GB", str(1.5 * size / 2**30))  # room for one of the two
    second = importer.ensure_converted(b, cache)
    assert not first.exists() and (second / importer.COMPLETE).is_file()
    bad = subprocess.run(
        mlxcel_cmd() + ["cache", "rm", "no-such"], capture_output=True, text=True, env=env, timeout=120
    )
    assert bad.returncode == 2 and "no cache entry named no-such" in bad.stderr
    rm = subprocess.run(
        mlxcel_cmd() + ["cache", "rm", second.name], capture_output=True, text=True, env=env, timeout=120
    )
    assert rm.returncode == 0 and not second.exists() and "removed 1 conversion(s)" in rm.stderr


def test_cache_rm_removes_an_entry_that_is_a_symlink_and_never_its_target(tmp_path, cli_env):
    """`cache rm` said "removed 1 conversion(s)" of a symlinked entry and `cache ls` still listed it."""
    import os
    import subprocess

    from conftest import mlxcel_cmd

    cache = tmp_path / "cache"
    (cache / "gguf").mkdir(parents=True)
    elsewhere = tmp_path / "my-model"
    elsewhere.mkdir()
    (elsewhere / "COMPLETE").write_text("")
    (elsewhere / "weights").write_bytes(b"x" * 10)
    os.symlink(elsewhere, cache / "gguf" / "linked")
    env = {**cli_env, "MLXCEL_CACHE_DIR": str(cache)}

    def run(*args):
        return subprocess.run(mlxcel_cmd() + ["cache", *args], capture_output=True, text=True, env=env, timeout=120)

    assert run("ls").stdout.startswith("linked\t")
    rm = run("rm", "linked")
    assert rm.returncode == 0 and "removed 1 conversion(s)" in rm.stderr, rm.stderr
    assert run("ls").stdout == "" and not (cache / "gguf" / "linked").exists()
    assert (elsewhere / "weights").read_bytes() == b"x" * 10  # what it pointed to is the user's


def test_a_gguf_model_is_named_by_its_file_not_its_conversion(tmp_path, monkeypatch):
    """/props' model_path (llama.cpp's test_server_props asserts ".gguf" in it) and every other
    place that shows the model say the file the user gave, not the cache folder it became."""
    from mlxcel_py.models import loading

    monkeypatch.setenv("MLXCEL_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "m.gguf"
    gguf_files.write(path, "llama", [Q.Q8_0])
    resolved = loading.resolve(str(path))
    assert resolved.named == path.resolve() and resolved.path != resolved.named
    assert resolved.path.is_relative_to(tmp_path / "cache")
    folder = loading.resolve(str(resolved.path))  # a folder is named by itself
    assert folder.named == folder.path == resolved.path


@pytest.mark.parametrize("kind,want", [("llama", 1), ("gpt2", 2), ("bert", 3), ("t5", 4), ("rwkv", 5)])
def test_vocab_type_is_the_gguf_files_own_tokenizer_model(tmp_path, kind, want):
    """serve's `meta.vocab_type`: llama.cpp's number for the file's `tokenizer.ggml.model`, as
    llama-server reads it, not a guess from the converted tokenizer.json (which says byte-level
    BPE here, 2); a folder without a GGUF still answers from its tokenizer.json."""
    import gguf

    from mlxcel_py.server.model_meta import vocab_type

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "tokenizer.json").write_text('{"model": {"type": "BPE", "byte_fallback": false}}')
    path = tmp_path / "v.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("tokenizer.ggml.model", kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert vocab_type(folder, path) == want
    assert vocab_type(folder) == 2
    (tmp_path / "bad.gguf").write_bytes(b"GGUF\x03\x00\x00\x00truncated")
    assert vocab_type(folder, tmp_path / "bad.gguf") == 2
