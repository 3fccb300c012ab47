"""The kernel's builds (csrc/isa_begin.h, csrc/simd.h): AVX2 and AVX-VNNI give AVX-512's bits.

Every kernel runs under `set_isa(...)` for each build this CPU runs, on the same inputs, and the
results must be equal bit for bit: the matmul (4 and 8 bits, partial row groups, float16 scales,
1-20 rows), the float matmul (float32, float16, bfloat16 weights), the attention (every head width path, causal blocks), rope, SwiGLU, the fused
decoder layers and whole greedy decodes of the default model. On a CPU that runs one build only
there is nothing to compare against and these tests are skipped (not passed). A CPU with AVX-512
VNNI but not AVX-VNNI (this project's CI) runs the AVX-VNNI build's code through the test build
of the extension whose vpdpbusd is the EVEX one (`make test-avxvnni`). `MLXCEL_KERNEL_ISA` picks a
build from the environment.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import pytest
from test_cpu_weights import _quantized
from test_decoder_layers import CONFIGS, _greedy_logits
from tiny_models import build

from mlxcel_py.cpu import extension as cpu_extension
from mlxcel_py.models import loading

QMM, WHY = cpu_extension.kernel_status()
BUILDS = [isa for isa in ("avx512", "avxvnni", "avx2") if QMM is not None and QMM.isa_supported(isa)]
several_builds = pytest.mark.skipif(
    len(BUILDS) < 2, reason=f"needs the kernel and a CPU that runs two of its builds to compare ({WHY}; {BUILDS})"
)


def _under_each(compute: Callable[[], object]) -> list[object]:
    """compute() evaluated on each build this CPU runs, the best first (MLX is lazy: each result
    is evaluated before the switch)."""
    before = QMM.isa()
    try:
        out = []
        for isa in BUILDS:
            assert QMM.set_isa(isa) and QMM.isa() == isa
            result = compute()
            mx.eval(result)
            out.append(result)
        return out
    finally:
        QMM.set_isa(before)


def _equal(a, b, *more) -> bool:
    if more:
        return _equal(a, b) and all(_equal(a, c) for c in more)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a.shape == b.shape and mx.array_equal(a, b).item()


def test_the_avxvnni_test_build_runs_when_asked():
    """make test-avxvnni sets MLXCEL_TEST_AVXVNNI_EVEX: the extension it runs must be the test
    build, on its AVX-VNNI kernels, beside two other builds (else that run proves nothing)."""
    if not os.environ.get("MLXCEL_TEST_AVXVNNI_EVEX"):
        pytest.skip("only under make test-avxvnni")
    assert QMM is not None and QMM.avxvnni_as_evex() and QMM.isa() == "avxvnni"
    assert BUILDS == ["avx512", "avxvnni", "avx2"]


@several_builds
@pytest.mark.parametrize("bits", [4, 8])
def test_the_matmul_gives_the_same_bits_on_several_builds(bits):
    for n, k in ((200, 576), (37, 64), (48, 1536), (16, 1024)):  # 200 and 37: a last group of 8 and 5 rows
        w, s, b, _ = _quantized(n, k, bits, seed=n)
        for half in (False, True):
            sc, bc = (s.astype(mx.float16), b.astype(mx.float16)) if half else (s, b)
            if half and not (mx.array_equal(sc.astype(mx.float32), s).item()):
                sc, bc = s, b  # float16 scales only where they are exact (the kernel's contract)
            for m in (1, 2, 3, 5, 8, 13, 20):
                mx.random.seed(m)
                x = mx.random.normal((m, k)) * (30.0 if m % 2 else 0.5)
                got = _under_each(lambda: QMM.row_exact_qmm(x, w, sc, bc, bits))  # noqa: B023
                assert _equal(*got), (bits, n, k, m, half)
                # a symmetric weight: biases computed from the scales, not read
                none = mx.zeros((0,), dtype=sc.dtype)
                got = _under_each(lambda: QMM.row_exact_qmm(x, w, sc, none, bits))  # noqa: B023
                assert _equal(*got), (bits, n, k, m, half, "symmetric")
        ids = mx.array([[0, n - 1], [n // 2, 3]])
        assert _equal(*_under_each(lambda: QMM.dequantize_rows(w, s, b, bits, ids)))  # noqa: B023


@several_builds
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_the_float_matmul_gives_the_same_bits_on_several_builds(dtype):
    """The float kernel (a float layer in its stored precision): every tile shape, partial groups."""
    mx.random.seed(9)
    for n, k in ((40, 64), (33, 100), (200, 576)):
        packed = QMM.float_repack((mx.random.normal((n, k)) * 0.1).astype(dtype))
        for m in (1, 3, 8, 13):
            x = mx.random.normal((m, k))
            got = _under_each(lambda x=x, w=packed, n=n: QMM.row_exact_fmm_multi(x, [w, w], [n, n]))
            assert _equal(*got), (n, k, m)


@several_builds
def test_the_matmul_with_extreme_weights_gives_the_same_bits():
    """All-255 8-bit weights times all-127 activations: the AVX2 path's int16 sums at their
    largest (8 runs x 2 x 15 x 127 per nibble), where a saturating shortcut would differ."""
    k, n = 1536, 32
    wq = mx.full((n, k * 8 // 32), 0xFFFFFFFF, dtype=mx.uint32)
    w = QMM.repack(wq, 8)
    s = QMM.interleave(mx.full((n, k // 32), 0.01))
    b = QMM.interleave(mx.full((n, k // 32), -1.0))
    x = mx.concatenate([mx.full((1, k), 3.0), mx.full((1, k), -3.0), mx.random.normal((2, k)) * 1000])
    got = _under_each(lambda: QMM.row_exact_qmm(x, w, s, b, 8))
    assert _equal(*got)
    a = got[0]
    # and they are the right numbers: 255 * 0.01 - 1 = 1.55 per weight, x = 3 exactly in int8
    assert abs(a[0, 0].item() - 1.55 * 3.0 * k) < 1e-2 * k


@several_builds
def test_attention_rope_and_swiglu_give_the_same_bits():
    mx.random.seed(2)
    for s_len, length, dim in (
        (40, 1, 64),
        (40, 8, 64),
        (100, 33, 64),
        (20, 20, 48),
        (70, 65, 80),
        (30, 3, 128),
        (9, 2, 32),
    ):
        q = mx.random.normal((1, 6, length, dim)) * 3
        k, v = mx.random.normal((1, 2, s_len, dim)) * 3, mx.random.normal((1, 2, s_len, dim))
        for causal in (True, False):
            got = _under_each(lambda: QMM.row_exact_attention(q, k, v, 0.125, causal))  # noqa: B023
            assert _equal(*got), (s_len, length, dim, causal)
    x = mx.random.normal((3, 4, 5, 64)) * 3
    for trad in (False, True):
        assert _equal(*_under_each(lambda: QMM.row_rope(x, 64, trad, 1e4, 1.0, 0, mx.array([0, 77, 700]))))  # noqa: B023
    gate = mx.concatenate([mx.random.normal((5, 1, 1541)) * 8, mx.full((1, 1, 1541), -200.0)])
    up = mx.random.normal((6, 1, 1541))
    assert _equal(*_under_each(lambda: QMM.row_swiglu(gate, up)))


@several_builds
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fused_decoder_layers_give_the_same_logits_on_several_builds(name, tmp_path):
    loaded = loading.load(loading.resolve(str(build(tmp_path / "model", CONFIGS[name], seed=5, scale=1.0))))
    prompt = list(range(30, 110))  # a prefill chunk of 64 rows, then 16, then decode steps
    got = _under_each(lambda: _greedy_logits(loaded.model, prompt, 12))
    assert all(tok == got[0][0] for tok, _ in got) and _equal(*[logits for _, logits in got]), name


@several_builds
@pytest.mark.real
def test_default_model_decodes_the_same_logits_on_several_builds(real):
    prompt = real.tokenizer.encode("Write a short note about the sea, the wind and the boats.")
    got = _under_each(lambda: _greedy_logits(real.model, prompt, 24))
    assert all(tok == got[0][0] for tok, _ in got) and _equal(*[logits for _, logits in got])


def test_the_environment_picks_the_build_and_a_bad_value_is_a_usage_error(cli_env):
    if QMM is None:
        pytest.skip(f"row-exact kernel: {WHY}")

    def version(isa: str) -> subprocess.CompletedProcess:
        env = dict(cli_env, MLXCEL_KERNEL_ISA=isa)
        return subprocess.run(
            [sys.executable, "-m", "mlxcel_py", "--version"], env=env, capture_output=True, text=True, timeout=120
        )

    f32 = version("f32")
    assert f32.returncode == 0 and "turned off by MLXCEL_KERNEL_ISA=f32" in f32.stdout
    bad = version("sse9")
    assert bad.returncode == 2 and "MLXCEL_KERNEL_ISA='sse9' is not one of avx512, avxvnni, avx2, f32" in bad.stderr
    assert "Traceback" not in bad.stderr
    if QMM.isa_supported("avx2"):
        avx2 = version("avx2")
        assert avx2.returncode == 0 and "row-exact AVX2 kernel" in avx2.stdout
    if not QMM.isa_supported("avx512"):
        refused = version("avx512")
        assert refused.returncode == 0 and "this CPU lacks AVX-512 VNNI" in refused.stdout
    vnni = version("avxvnni")
    if QMM.isa_supported("avxvnni"):
        assert vnni.returncode == 0 and "row-exact AVX-VNNI kernel" in vnni.stdout
        assert ("test build: EVEX vpdpbusd" in vnni.stdout) == QMM.avxvnni_as_evex()
    else:  # the kernel is off (float32 weights), said in one line, not an error
        assert vnni.returncode == 0 and "this CPU lacks AVX-VNNI; CPU weights are float32" in vnni.stdout


def _functions_with(so: Path, pattern: re.Pattern) -> set[str]:
    """Names of the extension's functions whose code uses registers matching `pattern`."""
    text = subprocess.run(
        ["objdump", "-d", "-C", "--no-show-raw-insn", str(so)], capture_output=True, text=True, check=True
    ).stdout
    found, name = set(), None
    for line in text.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if head:
            name = head.group(1)
        elif name and pattern.search(line):
            found.add(name)
    return found


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) not installed")
def test_only_the_avx512_build_holds_avx512_code():
    """A function the linker shares between files (a standard-library template) must not carry
    AVX-512 into code an AVX2-only CPU runs: AVX-512 registers appear in mlxcel::avx512 code only,
    and vector code at all only in the three builds (the rest is built for the baseline ISA). The
    AVX-VNNI build's vpdpbusd is the VEX one (an AVX-VNNI laptop has no EVEX), and the AVX2 build
    has none."""
    if QMM is None:
        pytest.skip(f"row-exact kernel: {WHY}")
    so = Path(QMM.__file__)
    symbols = subprocess.run(["nm", "-C", str(so)], capture_output=True, text=True).stdout
    # a stripped library names only its exported functions, and code without a name would be
    # counted as the exported one before it: the build keeps its symbols (NOSTRIP) for this
    builds = ("mlxcel::avx512::", "mlxcel::avxvnni::", "mlxcel::avx2::")
    assert all(b in symbols for b in builds), "extension built stripped"
    # the test build (make test-avxvnni) runs the AVX-VNNI code with AVX-512 VL: EVEX allowed there
    evex_ok = builds[:2] if QMM.avxvnni_as_evex() else builds[:1]
    avx512 = _functions_with(so, re.compile(r"%zmm|%k[1-7]|%[xy]mm(1[6-9]|2[0-9]|3[01])\b"))
    assert avx512 and all(any(b in f for b in evex_ok) for f in avx512), sorted(avx512)[:5]
    wide = _functions_with(so, re.compile(r"%ymm"))
    assert any("mlxcel::avx2::" in f for f in wide) and any("mlxcel::avxvnni::" in f for f in wide)
    # mlx's and nanobind's own code is linked in; ours outside the three builds uses no ymm
    ours = [f for f in wide if "mlxcel::" in f and not any(b in f for b in builds)]
    assert ours == [], ours[:5]
    dot = _functions_with(so, re.compile(r"\bvpdpbusd\b"))
    assert dot and all(any(b in f for b in builds[:2]) for f in dot), sorted(f for f in dot if "avx2::" in f)[:5]
    if not QMM.avxvnni_as_evex():
        vex = _functions_with(so, re.compile(r"\{vex\} vpdpbusd"))
        assert {f for f in dot if "mlxcel::avxvnni::" in f} <= vex and vex, "AVX-VNNI build without VEX vpdpbusd"
