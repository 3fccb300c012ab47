"""Model resolution and loading: `--model`/`--draft-model` string -> ready mlx-lm model + tokenizer.

Owns: telling a local folder, a GGUF file, a Hugging Face repo id and the default model apart;
checking `config.json` before any weight is read; loading through `mlx_lm.load`; the CPU dtype
weight form (`cpu_weights`: the row-exact quantized kernel or float32) and kernels (`cpu_kernels`); and the checks that need a model
(caches that can be rolled back). Every library failure becomes a one-line ModelError here, so no traceback
reaches the user.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ModelError
from ..paths import cache_dir
from . import default_model
from .config import read_config
from .gguf import convert as gguf

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..cpu.weights import WeightsReport
    from ..options import AdapterSpec

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
BARE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
DEFAULT_ORG = "mlx-community"


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model's files are, before anything heavy is read."""

    path: Path
    source: str  # human text: "local folder ...", "GGUF ... (converted)", "default model ..."
    config: dict = field(repr=False, hash=False, compare=False, default_factory=dict)
    gguf: Path | None = None  # the GGUF file the folder was converted from (peers run on it)
    projector: Path | None = None  # --mmproj's conversion (models.gguf.mmproj): a vision model's tower

    @property
    def named(self) -> Path:
        """What the user named: a GGUF file itself, not the folder it was converted into."""
        return self.gguf or self.path


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    resolved: ResolvedModel
    dtype: str
    load_seconds: float
    kernels: str  # what computes attention and SwiGLU (cpu_kernels.enable)
    weights: WeightsReport | None = None  # on the CPU (None: weights as stored)
    kv_cache: str = "f32 keys, f32 values"  # the KV cache type in use (--cache-type-k/-v)
    kv_bytes_per_token: int = 0  # the cache's bytes a token over every layer (0: not known)
    kv_note: str | None = None  # why an explicit cache type could not apply (models.kv_cache)
    vision: Any = None  # a vision-language model's vision.prompts.Vision (None: text only)
    adapters: list = field(default_factory=list)  # models.adapters.Adapter, in their flags' order

    @property
    def kv_summary(self) -> str:
        """The KV cache type and its size, for --verbose and --profile."""
        size = f", {self.kv_bytes_per_token:,} bytes a token" if self.kv_bytes_per_token else ""
        return self.kv_cache + size

    @property
    def config(self) -> dict:
        return self.resolved.config

    @property
    def context_length(self) -> int:
        cfg = self.config
        for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
            if isinstance(cfg.get(key), int) and cfg[key] > 0:
                return cfg[key]
        return 4096

    @property
    def vocab_size(self) -> int | None:
        v = self.config.get("vocab_size")
        return v if isinstance(v, int) else None


def resolve(
    spec: str | None, *, revision: str | None = None, what: str = "--model", mmproj: str | None = None
) -> ResolvedModel:
    """Find a model's folder without reading weights (GGUF files are converted here, once;
    `mmproj`: llama.cpp's vision projector beside a .gguf, converted here too)."""
    resolved = _resolve(spec, revision=revision, what=what)
    if mmproj is None:
        return resolved
    if resolved.gguf is None:
        raise ModelError(
            f"--mmproj pairs with a .gguf model; {resolved.named} is a folder (a vision model's folder holds "
            "its projector already)",
            exit_code=2,
        )
    p = Path(mmproj).expanduser()
    if not p.is_file():
        raise ModelError(f"--mmproj {mmproj}: no such file", exit_code=2)
    with open(p, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise ModelError(f"--mmproj {mmproj}: a file that is not GGUF", exit_code=2)
    from .gguf import mmproj as gguf_mmproj

    projector = gguf_mmproj.projector_dir(p.resolve(), resolved.path, cache_dir())
    return replace(
        resolved, source=f"{resolved.source}; vision projector {p} (converted in {projector})", projector=projector
    )


def _resolve(spec: str | None, *, revision: str | None, what: str) -> ResolvedModel:
    cache_root = cache_dir()
    if spec is None:
        path = default_model.default_gguf()
        folder = gguf.ensure_converted(path, cache_root)
        source = f"default model {default_model.DEFAULT_MODEL_NAME} (from the {default_model.DEFAULT_MODEL_PACKAGE} wheel, {path.name}, converted in {folder})"
        return ResolvedModel(folder, source, read_config(folder, what=what), gguf=path)
    p = Path(spec).expanduser()
    if os.path.lexists(p) and not p.exists():  # stat fails: a symlink loop, or a link to nothing
        raise ModelError(
            f"{what} {spec}: a symbolic link that leads to no file or folder (a loop, or a removed target)"
        )
    if p.exists():
        if revision is not None:
            raise ModelError(f"--revision applies to repo ids, not to the local path {spec}", exit_code=2)
        if not p.is_file() and not p.is_dir():
            raise ModelError(
                f"{what} {spec}: not a folder or a regular file (a FIFO or a device); pass a model folder or a .gguf file"
            )
        if p.is_file():
            with open(p, "rb") as fh:
                magic = fh.read(4)
            if magic != b"GGUF":
                raise ModelError(f"{what} {spec}: a file that is not GGUF; pass a model folder or a .gguf file")
            folder = gguf.ensure_converted(p.resolve(), cache_root)
            return ResolvedModel(
                folder, f"GGUF file {p} (converted in {folder})", read_config(folder, what=what), gguf=p.resolve()
            )
        return ResolvedModel(p, f"local folder {p}", read_config(p, what=what))
    if REPO_ID.match(spec) and not spec.startswith("."):
        folder = _hub_snapshot(spec, revision, what)
        return ResolvedModel(folder, f"Hugging Face cache {spec} ({folder})", read_config(folder, what=what))
    if BARE_NAME.match(spec) and not spec.startswith(".") and not spec.endswith(".gguf"):
        # mlxcel's resolver: a bare name is a repo of $MLXCEL_DEFAULT_ORG (default mlx-community)
        org = os.environ.get("MLXCEL_DEFAULT_ORG") or DEFAULT_ORG
        repo = f"{org}/{spec}"
        folder = _hub_snapshot(repo, revision, what, asked=spec)
        return ResolvedModel(folder, f"Hugging Face cache {repo} ({folder})", read_config(folder, what=what))
    raise ModelError(
        f"{what} {spec}: no such file or folder",
        hint="pass an mlx-lm model folder, a .gguf file, an owner/name repo id or a bare name "
        "(omit --model for the default model)",
    )


def _hub_snapshot(repo_id: str, revision: str | None, what: str = "--model", asked: str | None = None) -> Path:
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja"]
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns, local_files_only=True))
    except Exception:
        pass
    named = f"{asked} (read as {repo_id}; set MLXCEL_DEFAULT_ORG for another organisation)" if asked else repo_id
    from .hub import offline

    if offline():
        raise ModelError(
            f"{what} {named}: not in the local Hugging Face cache, and --offline (HF_HUB_OFFLINE) forbids downloading it",
            hint="drop --offline where the hub is reachable, or pass a local folder or .gguf file",
        )
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
    except Exception as exc:
        reason = type(exc).__name__
        raise ModelError(
            f"{what} {named}: not in the local Hugging Face cache and could not be downloaded ({reason})",
            hint=f"run `huggingface-cli download {repo_id}` where the hub is reachable, or pass a local folder",
        ) from None


def check_rollback(model: Any, *, what: str = "the target model") -> None:
    """Speculation rolls rejected drafts back (trim, window slice or checkpoint replay, see
    engine/cache.py); refuse only a model whose caches none of them can restore."""
    from mlx_lm.models.cache import make_prompt_cache

    from .cache_kinds import why_not_rollback

    why = why_not_rollback(make_prompt_cache(model))
    if why:
        raise ModelError(
            f"{what} cannot speculate: {why}, so a rejected draft cannot be undone",
            hint="decode without speculation (drop --prompt-lookup / --draft-model / --draft-kind)",
        )


def _weightless(config: dict) -> Any:
    """The model a config describes, its weights never evaluated (None where it does not build:
    load() builds it the same way and reports the failure in its own words)."""
    from mlx_lm.utils import _get_classes

    try:
        model_cls, args_cls = _get_classes(config)
        return model_cls(args_cls.from_dict(config))
    except Exception:
        return None


def check_rollback_config(config: dict, *, what: str = "the target model") -> None:
    """The rollback check on a weightless instance, so it runs before any weight loads."""
    model = _weightless(config)
    if model is not None:
        check_rollback(model, what=what)


def check_tree_config(config: dict, flag: str) -> None:
    """Draft trees (engine/tree.py) need every layer to keep plain KV caches: a recurrent state
    or a rotating window cannot hold several branches in one forward. Checked on a weightless
    instance, before any weight loads."""
    from mlx_lm.models.cache import KVCache, make_prompt_cache

    from .cache_kinds import describe_kinds

    model = _weightless(config)
    layers = make_prompt_cache(model) if model is not None else []
    if not all(type(c) is KVCache for c in layers):
        raise ModelError(
            f"{flag}: draft trees need a model whose every layer keeps plain keys and values; this one's "
            f"caches are {describe_kinds(layers)} (recurrent states and sliding windows follow one branch)",
            hint="drop the flag: its rounds verify chains",
        )


def load_tokenizer_only(resolved: ResolvedModel):
    from mlx_lm.utils import load_tokenizer

    try:
        return load_tokenizer(resolved.path, eos_token_ids=resolved.config.get("eos_token_id"))
    except Exception as exc:
        raise ModelError(
            f"cannot load the tokenizer in {resolved.path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None


def _cpu_weights(model: Any, dequantize: bool, mode: str):
    """On the CPU: the kernels' layers or float32 (`cpu_weights`); elsewhere as stored."""
    import mlx.core as mx
    import mlx.nn as nn

    from ..cpu import weights as cpu_weights

    if not (mx.default_device() == mx.cpu and dequantize):
        quantized = any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in model.named_modules())
        return ("quantized (as stored)" if quantized else "as stored"), None
    report = cpu_weights.apply(model, mode)
    return report.describe(), report


def _sharded_weights(model: Any, dequantize: bool, world: Any, mode: str):
    """A distributed rank's part of the weights, read lazily so a rank reads only its own part.
    On the CPU a rank's part goes on the kernels in `mode`, as one process holds them: a pipeline
    stage (`--pp-size`) holds whole layers, and a tensor-parallel rank (`--tp-size`) holds every
    linear split by its outputs (`parallel.exact_tp`), so each row is one process's bits and so is
    the output. A family whose sharding cannot be split that way (experts, in-place splits) keeps
    mlx-lm's sharded layers in float32, whose row-parallel halves are summed across ranks; `q8`
    and `q4` are refused there. Elsewhere weights stay as stored. (`world` is a
    parallel.distributed.World, which this layer reaches only through its methods.)"""
    import mlx.core as mx
    from mlx_lm.utils import dequantize_model

    from ..cpu import weights as cpu_weights

    on_cpu = mx.default_device() == mx.cpu and dequantize
    part = f"{world.layout.describe()}, rank {world.rank} of {world.size}"
    why = None
    if on_cpu and world.layout.tp_size > 1 and mode != "f32":
        why = world.why_not_exact(model)  # parallel.distributed.World
        if why is not None and mode in ("q8", "q4"):
            kind = getattr(getattr(model, "args", None), "model_type", "this model")
            raise ModelError(
                f"--cpu-weights {mode} under --tp-size needs every linear split by its outputs, "
                f"and {kind}'s sharding cannot be ({why})",
                hint="drop --cpu-weights (auto runs MLX's sharded layers in float32 there), or use --pp-size",
            )
    if on_cpu and why is None and (world.layout.pp_size > 1 or mode != "f32"):
        world.take_part(model, exact=world.layout.tp_size > 1)  # parallel.distributed.World
        report = cpu_weights.apply(model, mode)
        return f"{report.describe()} ({part})", report
    if on_cpu:
        dequantize_model(model)
        model.set_dtype(mx.float32)
    world.take_part(model)
    if not on_cpu:
        return f"as stored ({part})", None
    note = f"{part}: MLX's sharded layers" + (f" ({why})" if why else "")
    report = cpu_weights.WeightsReport("f32", mode, 0, 0, (), note, cpu_weights.weight_bytes(model))
    return report.describe(), report


def load(
    resolved: ResolvedModel,
    *,
    dequantize: bool = True,
    fast_kernels: bool = True,
    cpu_weights: str = "auto",
    world: Any = None,
    cache_types: tuple[str, str] = ("auto", "auto"),
    text_only: bool = False,
    adapters: Sequence[AdapterSpec] = (),
) -> LoadedModel:
    """Read weights and tokenizer of a resolved model (`world`: only this rank's part of them;
    `text_only`: never as a vision-language model, as a drafter is read; `adapters`: fused into
    the weights first, each at its scale, models.adapters)."""
    import mlx_lm

    from ..vision import loading as vision_loading

    start = time.perf_counter()
    projector = resolved.projector is not None and world is None and not text_only
    vision_family = None if world is not None or text_only else vision_loading.family(resolved.config)
    if adapters and (projector or vision_family is not None):
        a = adapters[0]
        raise ModelError(f"{a.flag} {a.path}: adapters are fused into text models only, not vision models yet")
    if projector:
        return _load_gguf_vision(resolved, dequantize, fast_kernels, cpu_weights, cache_types, start)
    if vision_family is not None:
        return _load_vision(resolved, vision_family, dequantize, fast_kernels, cpu_weights, cache_types, start)
    try:
        model, tokenizer = mlx_lm.load(str(resolved.path), lazy=world is not None)
    except (ValueError, FileNotFoundError, KeyError, OSError, ImportError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelError(f"cannot load {resolved.path}: {text}") from None
    read_adapters = []
    if adapters:
        from . import adapters as adapter_files

        read_adapters = adapter_files.load_all(model, adapters, resolved.config)
    if world is not None:
        dtype, weights = _sharded_weights(model, dequantize, world, cpu_weights)
    else:
        dtype, weights = _cpu_weights(model, dequantize, cpu_weights)
    kernels = _kernels(model, weights, fast_kernels, cache_types)
    from . import kv_cache

    took = time.perf_counter() - start
    loaded = LoadedModel(model, tokenizer, resolved, dtype, took, kernels, weights, adapters=read_adapters)
    return kv_cache.describe(loaded, cache_types)


def _kernels(model: Any, weights: Any, fast_kernels: bool, cache_types: tuple[str, str]) -> str:
    """Turn on the CPU kernels for `model` (its weights already in their CPU form); returns what runs."""
    import mlx.core as mx

    from ..cpu import kernels as cpu_kernels

    # only the CPU backend has the slow exp these kernels replace
    kernels = cpu_kernels.enable(model) if fast_kernels and mx.default_device() == mx.cpu else cpu_kernels.STOCK
    if weights is not None and weights.kernel_layers and not weights.inexact:
        from ..cpu import row_ops as cw_row_ops

        cpu_kernels.enable_row_exact(
            model, cw_row_ops.attention, cw_row_ops.swiglu
        )  # why_rows_not_exact checked that it routes
        kernels += "; row-exact attention, SwiGLU" + ("; rope" if cw_row_ops.patch_rope(model) else "")
        from . import decoder_layers

        if fused := decoder_layers.install(model, cache_types):
            kernels += f"; {fused} fused decoder layers"
            kv = decoder_layers.fused_layers(model)[0].kv_dtypes
            if kv != (mx.float32, mx.float32):  # mlx-lm's layer code reads what the fused layers store
                cpu_kernels.enable_row_exact(model, cw_row_ops.attention_at(kv), cw_row_ops.swiglu)
    return kernels


def _load_vision(resolved, family, dequantize, fast_kernels, cpu_weights, cache_types, start) -> LoadedModel:
    """A vision-language model: mlx-vlm's model and processor; its text decoder as mlx-lm's model
    of the family where mlx-lm has one (then on the CPU weights and kernels a text model gets),
    else mlx-vlm's own language model in the weights as stored."""
    from ..vision import loading as vision_loading

    target, tokenizer, vision, dtype = vision_loading.load(resolved, family)
    weights, kernels = None, "stock"
    if (text := vision_loading.text_model(target.vlm, resolved.config)) is not None:
        dtype, weights = _cpu_weights(text, dequantize, cpu_weights)
        kernels = _kernels(text, weights, fast_kernels, cache_types)
        _decode_with(target, text)
    from . import kv_cache

    resolved = replace(resolved, config=vision_loading.text_config(resolved.config))
    took = time.perf_counter() - start
    loaded = LoadedModel(target, tokenizer, resolved, dtype, took, f"{kernels} (vision model)", weights, vision=vision)
    return kv_cache.describe(loaded, cache_types)


def _load_gguf_vision(resolved, dequantize, fast_kernels, cpu_weights, cache_types, start) -> LoadedModel:
    """A text .gguf with its --mmproj: the text model as any GGUF loads (its quantized weights on
    the row-exact kernels), the vision tower and projector from the projector's conversion."""
    from ..vision import loading as vision_loading
    from . import kv_cache

    text = load(
        replace(resolved, projector=None),
        dequantize=dequantize,
        fast_kernels=fast_kernels,
        cpu_weights=cpu_weights,
        cache_types=cache_types,
    )
    projector = ResolvedModel(
        resolved.projector, f"vision projector {resolved.projector}", read_config(resolved.projector)
    )
    target, _, vision, _ = vision_loading.load(projector, projector.config["model_type"], decoder=text.model)
    _decode_with(target, text.model)
    vision.tokenizer = text.tokenizer
    took = time.perf_counter() - start
    loaded = LoadedModel(
        target,
        text.tokenizer,
        resolved,
        text.dtype,
        took,
        f"{text.kernels} (vision model)",
        text.weights,
        vision=vision,
    )
    return kv_cache.describe(loaded, cache_types)


def _decode_with(target: Any, text: Any) -> None:
    """A vision model decodes with `text`, mlx-lm's model of its decoder, and the CPU kernels
    enabled for `text` engage for the vision model's forwards."""
    from ..cpu import kernels as cpu_kernels

    target.run_text_with(text)
    cpu_kernels.alias(target, text)
