"""GGUF import: turn a GGUF file into an mlx-lm model folder, once, in the cache.

Reading: gguf-py (`gguf.GGUFReader`, maintained with llama.cpp) parses the header, metadata and
tensor table, so the architecture and every tensor type are known before anything is converted;
an unmapped architecture (`gguf_arch`), an unmapped tensor or a type nobody can decode is refused
there, naming it. Decoding: a file whose tensors are all types MLX reads itself (F32, F16, Q4_0,
Q4_1, Q8_0) goes through `mx.load`, which hands back Q4_0/Q4_1/Q8_0 as MLX affine triples
(group 32; on the CPU the scales are widened to float32); any other file (K-quants, i-quants, Q5_x, BF16...) is decoded tensor by tensor.
Q4_K, the bulk of a Q4_K_M file, is itself affine 4-bit in groups of 32 (each sub-block's
w = d*sc*q - dmin*m), so its blocks become an MLX affine triple directly (`_q4k_affine`): the same
values as gguf-py's dequantizer bit for bit, 4 bits a weight in the cache and on the row-exact
kernel instead of float32 re-quantized to 8 bits. Other types go through gguf-py's dequantizers
and are re-quantized to MLX's affine 8-bit in groups of 32 on the CPU (the kernel's nearest form:
what it made of their float32 decoding at load before, now without ~4 bytes a weight in the cache
and the load-time quantization), and to 4- or 8-bit on Metal/CUDA so weights stay small.
Then the architecture's quirks are undone (`gguf_arch`), a `config.json` written (with per-module
bit widths), and the tokenizer rebuilt from the metadata (`gguf_tokenizer`).

The folder is written under a temporary name and renamed into place with a `COMPLETE` marker
written last, so an interrupted conversion leaves nothing that would be loaded; only a folder with
the marker is re-used. Stock mlx-lm can load the result too (benchmarks compare like with like).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import ModelError
from ...inputs.digits import whole_number
from . import arch as gguf_arch
from . import cache as conversions
from . import tokenizer as gguf_tokenizer
from .cache import COMPLETE

GROUP_SIZE = 32  # every GGUF block quant MLX reads has 32 values per block
# bump when the folder layout changes, so old cache entries are not re-used (v3: Q4_K direct; v4:
# other decoded quantized types stored 8-bit on the CPU too, not float32; v5: the tokenizer adds the
# BOS/EOS llama.cpp adds to a whole prompt)
FORMAT = "v5"
MLX_NATIVE = frozenset({"F32", "F16", "Q4_0", "Q4_1", "Q8_0"})
_FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})
# MLX affine bits for re-quantizing a decoded tensor off the CPU: at least the source's precision
_EIGHT_BIT = frozenset({"Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "Q8_1", "Q8_K"})


def read(gguf_path: Path):
    """gguf-py's reader, or a one-line error naming the file."""
    from gguf import GGUFReader

    try:
        return GGUFReader(str(gguf_path))
    except Exception as exc:  # struct.error, ValueError, OSError: a truncated or foreign file
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelError(f"{gguf_path}: cannot read as GGUF ({text})") from None


def metadata(reader) -> dict:
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def _shape(tensor) -> tuple[int, ...]:
    return tuple(int(d) for d in reversed(tensor.shape))  # ggml lists the innermost axis first


def _check_types(reader, gguf_path: Path) -> set[str]:
    """Every tensor type must be one MLX or gguf-py can decode; refuse before converting anything."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, quants

    first = {}  # one tensor of each type: the probe below runs once per type, not per tensor
    for t in reader.tensors:
        first.setdefault(t.tensor_type.name, t)
    for name, t in first.items():
        if name in _FLOAT_TYPES or name in MLX_NATIVE:
            continue
        try:
            quants.dequantize(np.zeros((1, GGML_QUANT_SIZES[t.tensor_type][1]), np.uint8), t.tensor_type)
        except (NotImplementedError, KeyError):
            raise ModelError(
                f"{gguf_path}: tensor {t.name} has type {name}, which neither MLX nor gguf-py can decode",
                hint="re-quantize the file with llama-quantize to Q4_K_M, Q8_0 or F16",
            ) from None
    return set(first)


def _decode(tensor):
    """One tensor as a numpy array in its logical shape (float32 unless stored as F16)."""
    import numpy as np
    from gguf import quants

    name = tensor.tensor_type.name
    shape = _shape(tensor)
    if name == "F32":
        return np.asarray(tensor.data, dtype=np.float32).reshape(shape)
    if name == "F16":
        return np.asarray(tensor.data).view(np.float16).reshape(shape)
    return quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)


def _q4k_affine(tensor):
    """A Q4_K tensor as MLX affine 4-bit, group 32: (packed uint32 [rows, cols/8], scales and
    biases float32 [rows, cols/32]). Each 256-value block holds 8 sub-blocks of 32 with a 6-bit
    scale and min: scale = d*sc and bias = -dmin*m are exact in float32 (an fp16 times a 6-bit
    integer), so dequantizing gives gguf-py's values bit for bit. The block fields are read with
    gguf-py's own Q4_K helpers."""
    import numpy as np
    from gguf.quants import Q4_K

    rows, cols = _shape(tensor)
    blocks = np.asarray(tensor.data, dtype=np.uint8).reshape(-1, Q4_K.type_size)
    n = blocks.shape[0]
    d, rest = np.hsplit(blocks, [2])
    dmin, rest = np.hsplit(rest, [2])
    scales, qs = np.hsplit(rest, [Q4_K.K_SCALE_SIZE])
    sc, m = Q4_K.get_scale_min(scales)
    scale = d.view(np.float16).astype(np.float32) * sc.astype(np.float32)  # [n, 8]
    bias = -(dmin.view(np.float16).astype(np.float32) * m.astype(np.float32))
    # each 32 bytes of qs hold two sub-blocks: low nibbles the first, high nibbles the second
    q = (qs.reshape(n, -1, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & np.uint8(0x0F)
    q = q.reshape(rows, cols).astype(np.uint32)
    shifts = (np.arange(8, dtype=np.uint32) * 4).reshape(1, 1, 8)
    packed = np.bitwise_or.reduce(q.reshape(rows, cols // 8, 8) << shifts, axis=-1).astype(np.uint32)
    return packed, scale.reshape(rows, cols // GROUP_SIZE), bias.reshape(rows, cols // GROUP_SIZE)


def convert(gguf_path: Path, out_dir: Path, *, for_cpu: bool | None = None, keep_decoded: bool = False) -> Path:
    """Write an mlx-lm folder for `gguf_path` into `out_dir` (atomically) and return it.

    `for_cpu` (default: MLX's default device is the CPU): tensors decoded by gguf-py are re-quantized
    to MLX affine 8-bit and MLX's block scales are widened to float32; otherwise decoded tensors are
    re-quantized to 4 or 8 bits by their type and scales stay half precision. `keep_decoded`: store
    gguf-py's float32 decoding as it is (the tests of the decoders read it back exactly).
    """
    import mlx.core as mx

    reader = read(gguf_path)
    md = metadata(reader)
    arch_name = str(md.get("general.architecture", "unknown"))
    arch = gguf_arch.lookup(arch_name, gguf_path, md)
    types = _check_types(reader, gguf_path)
    by_name = {t.name: t for t in reader.tensors}
    unmapped = sorted(n for n in by_name if arch.mlx_name(n) is None and n not in arch.ignored)
    if unmapped:
        raise ModelError(
            f"{gguf_path}: {len(unmapped)} tensor(s) this importer does not map for '{arch_name}' "
            f"({', '.join(unmapped[:4])}{', ...' if len(unmapped) > 4 else ''})",
            hint="convert the original Hugging Face model with mlx_lm.convert instead",
        )
    vectors = {
        n: [float(x) for x in _decode(t).reshape(-1)]
        for n, t in by_name.items()
        if n in arch.ignored and len(t.shape) == 1
    }
    shapes = {n: _shape(t) for n, t in by_name.items()}
    config = {"model_type": arch.model_type, **arch.config(gguf_arch.Meta(md, arch_name, gguf_path, vectors), shapes)}
    config["bos_token_id"] = int(md.get("tokenizer.ggml.bos_token_id", 1))
    config["eos_token_id"] = int(md.get("tokenizer.ggml.eos_token_id", 2))
    if for_cpu is None:
        for_cpu = mx.default_device() == mx.cpu

    out: dict[str, Any] = {}
    quant: dict[str, Any] = {}
    if types <= MLX_NATIVE:
        try:
            weights = mx.load(str(gguf_path), format="gguf")  # a hub cache blob has no .gguf name
        except Exception as exc:  # mlx raises ValueError/RuntimeError with its own text
            raise ModelError(f"{gguf_path}: cannot read as GGUF ({exc})") from None
        for name, value in weights.items():
            base = name.rsplit(".", 1)[0]
            mlx_name = arch.mlx_name(base + ".weight" if name.endswith((".scales", ".biases")) else name)
            if mlx_name is None:
                continue  # ignored tensors (rope factors, read above)
            mlx_name = mlx_name.rsplit(".", 1)[0] + "." + name.rsplit(".", 1)[1]
            if name.endswith((".scales", ".biases")) and for_cpu:
                # MLX reads the f16 block scales as float16, and dequantizing then rounds every
                # weight to half precision; llama.cpp multiplies in float32, and so does the CPU
                # path (which dequantizes at load). On Metal/CUDA they stay half: float32 scales
                # would make every activation float32 there.
                value = value.astype(mx.float32)
            out[mlx_name] = _undo_quirks(arch, mlx_name, value, config)
            if name.endswith(".scales"):
                packed = weights[base + ".weight"]
                bits = packed.shape[-1] * 32 // (value.shape[-1] * GROUP_SIZE)
                quant[mlx_name[: -len(".scales")]] = {"group_size": GROUP_SIZE, "bits": int(bits)}
    else:
        for name, tensor in by_name.items():
            mlx_name = arch.mlx_name(name)
            if mlx_name is None:
                continue
            kind = tensor.tensor_type.name
            if kind == "Q4_K" and len(tensor.shape) == 2 and mlx_name.endswith(".weight"):
                module = mlx_name.rsplit(".", 1)[0]
                for part, value in zip(("weight", "scales", "biases"), _q4k_affine(tensor)):
                    value = mx.array(value if for_cpu or part == "weight" else value.astype("float16"))
                    out[f"{module}.{part}"] = _undo_quirks(arch, f"{module}.{part}", value, config)
                quant[module] = {"group_size": GROUP_SIZE, "bits": 4}
                continue
            value = _undo_quirks(arch, mlx_name, mx.array(_decode(tensor)), config)
            requantize = kind not in _FLOAT_TYPES and value.ndim >= 2 and value.shape[-1] % GROUP_SIZE == 0
            if requantize and not keep_decoded:
                bits = 8 if for_cpu or kind in _EIGHT_BIT else 4
                w, scales, biases = mx.quantize(value, group_size=GROUP_SIZE, bits=bits)
                module = mlx_name.rsplit(".", 1)[0]
                out[f"{module}.weight"], out[f"{module}.scales"], out[f"{module}.biases"] = w, scales, biases
                quant[module] = {"group_size": GROUP_SIZE, "bits": bits}
            else:
                out[mlx_name] = value
    if quant:
        bits = [v["bits"] for v in quant.values()]
        common = max(set(bits), key=bits.count)
        per_module = {k: v for k, v in quant.items() if v["bits"] != common}
        config["quantization"] = config["quantization_config"] = {
            "group_size": GROUP_SIZE,
            "bits": common,
            **per_module,
        }
    _write(gguf_path, out_dir, out, config, md, arch_name)
    return out_dir


def _undo_quirks(arch: gguf_arch.Arch, mlx_name: str, value, config: dict):
    if arch.permute_qk and ".self_attn.q_proj." in mlx_name:
        return _unpermute(value, config["num_attention_heads"])
    if arch.permute_qk and ".self_attn.k_proj." in mlx_name:
        return _unpermute(value, config["num_key_value_heads"])
    if arch.norm_shift and mlx_name.endswith("norm.weight"):
        return value - arch.norm_shift
    return value


def _unpermute(x, n_heads: int):
    """Undo llama.cpp's rotary row permutation on axis 0 (rows are output features).

    View the R rows as (heads, 2, R/heads/2) as the converter wrote them, i.e. read its layout
    (heads, R/heads/2, 2) back by swapping the last two of those axes.
    """
    rows = x.shape[0]
    rest = x.shape[1:]
    y = x.reshape(n_heads, rows // n_heads // 2, 2, *rest)
    return y.swapaxes(1, 2).reshape(rows, *rest)


def _write(gguf_path: Path, out_dir: Path, weights: dict, config: dict, md: dict, arch_name: str) -> None:
    import mlx.core as mx

    tok_json = gguf_tokenizer.tokenizer_json(md, arch_name, gguf_path)  # fails before anything is written

    def fill(tmp: Path) -> None:
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        (tmp / "tokenizer.json").write_text(tok_json)
        tok_config = gguf_tokenizer.tokenizer_config(md, config.get("max_position_embeddings", 2048))
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
        (tmp / "generation_config.json").write_text(json.dumps({"eos_token_id": config["eos_token_id"]}))
        (tmp / "SOURCE").write_text(f"converted from {gguf_path}\n")
        _check_loads(gguf_path, tmp)

    publish(out_dir, fill)


def publish(out: Path, fill: Callable[[Path], None]) -> None:
    """Write a cache folder: `fill` writes its files under a temporary name, the COMPLETE marker
    goes last (its presence means every file is whole), then the folder is renamed into place; a
    failure or an interrupt leaves nothing that would be loaded."""
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        fill(tmp)
        (tmp / COMPLETE).write_text("ok\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.replace(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def unwritable(cache_root: Path, source: Path, exc: OSError) -> ModelError:
    """A cache folder that cannot be made or written: one line, not a traceback."""
    return ModelError(
        f"cache folder {cache_root}: cannot write the conversion of {source.name} there "
        f"({exc.strerror or exc}); set MLXCEL_CACHE_DIR to a writable folder"
    )


HEAD_BYTES, TAIL_BYTES = 16 << 20, 1 << 20  # what the content key reads


def content_key(gguf_path: Path) -> str:
    """A cheap fingerprint of the file's content: its size and a hash of its first 16 MiB (the
    header, metadata and tensor index of any model this CPU runs, and the first tensors) and its
    last MiB. Name, size and mtime alone kept a stale conversion after a file was repaired in
    place (same name, size and mtime, new content)."""
    import hashlib

    h = hashlib.sha256()
    size = gguf_path.stat().st_size
    with open(gguf_path, "rb") as f:
        h.update(f.read(HEAD_BYTES))
        if size > HEAD_BYTES:
            f.seek(max(HEAD_BYTES, size - TAIL_BYTES))
            h.update(f.read(TAIL_BYTES))
    return f"{size}-{h.hexdigest()[:16]}"


def _check_loads(gguf_path: Path, folder: Path) -> None:
    """Build the model from the written config and load the written tensors into it (lazily: the
    shapes are checked, nothing is computed). A GGUF whose metadata disagrees with its tensors
    was converted, marked complete and then failed at every load, its ~100 MB kept in the cache."""
    from mlx_lm.utils import load_model

    try:
        load_model(folder, lazy=True)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelError(
            f"{gguf_path.name}: its metadata does not match its tensors ({text[:200]}); the file is "
            f"damaged or was written by a converter this loader does not know"
        ) from None


def converted_dir(gguf_path: Path, cache_root: Path) -> Path:
    """Where the conversion of this file lives: keyed by name, content and the format."""
    import mlx.core as mx

    device = "" if mx.default_device() == mx.cpu else "-affine"
    return cache_root / "gguf" / f"{gguf_path.stem}-{content_key(gguf_path)}-{FORMAT}{device}"


def remove_stale(out: Path) -> None:
    """Temporary folders left by conversions whose process is gone (killed mid-write)."""
    for tmp in out.parent.glob(f"{out.name}.tmp*"):
        pid = tmp.name.rsplit(".tmp", 1)[1]
        if whole_number(pid) and _alive(int(pid)):
            continue
        shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ensure_converted(gguf_path: Path, cache_root: Path) -> Path:
    out = converted_dir(gguf_path, cache_root)
    if (out / COMPLETE).is_file():
        conversions.touch(out)
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(out.parent, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
        remove_stale(out)
        made = convert(gguf_path, out)
        conversions.enforce_limit(made, out.parent)
        return made
    except OSError as exc:
        raise unwritable(cache_root, gguf_path, exc) from None
