"""Loading a vision-language model through mlx-vlm, MLX's model zoo for them.

A folder whose config.json declares a vision tower (`vision_config`) of a family mlx-vlm builds
loads here: mlx-vlm's model and processor, mlx-lm's tokenizer wrapper (the engine's detokenizer
and EOS ids), and `VisionTarget` as the engine's model; the config the engine reads is the text
model's. Where mlx-lm has the text decoder's family and its model takes input embeddings (LLaVA's
and Idefics3's llama, Gemma 3's gemma3_text...), `text_model` rebuilds the decoder as mlx-lm's
model holding the VLM's own weights, so models.loading puts it on the row-exact CPU kernels and
fused layers as any text model (4x the MLX layer code's decode on SmolVLM's shape); otherwise
mlx-vlm's language model runs, its weights as stored.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import ModelError


def family(config: dict) -> str | None:
    """mlx-vlm's family for a config that declares a vision tower, else None."""
    if not isinstance(config.get("vision_config"), dict):
        return None
    model_type = str(config.get("model_type", ""))
    try:
        from mlx_vlm.utils import get_model_type

        name = get_model_type(config) or model_type
    except Exception:
        name = model_type
    try:
        importlib.import_module(f"mlx_vlm.models.{name}")
    except ImportError:
        return None
    return name


def text_config(config: dict) -> dict:
    """The config with the text model's keys on top (context window, vocabulary, EOS)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    merged = {**config, **{k: v for k, v in text.items() if k != "model_type"}}
    for key in ("vocab_size", "eos_token_id"):
        if key in config and key not in text:
            merged[key] = config[key]
    return merged


def load(resolved: Any, name: str, decoder: Any = None) -> tuple[Any, Any, Any, str]:
    """(engine model, tokenizer, Vision, weights dtype) of a vision-language model folder
    (models.loading makes them its LoadedModel, with `text_config(config)` as the config).
    `decoder`: the text model, loaded apart (a GGUF's): the folder holds the vision tower and
    projector only, and mlx-vlm's own text model is never built in memory."""
    import mlx.core as mx
    from mlx_lm.utils import load_tokenizer
    from mlx_vlm import load as vlm_load

    from .prompts import Vision
    from .target import VisionTarget

    try:
        vlm, processor = vlm_load(str(resolved.path), lazy=decoder is not None, strict=decoder is None)
        eos = resolved.config.get("eos_token_id", (resolved.config.get("text_config") or {}).get("eos_token_id"))
        tokenizer = load_tokenizer(resolved.path, eos_token_ids=eos)
    except (ValueError, FileNotFoundError, KeyError, OSError, ImportError, TypeError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelError(f"cannot load {resolved.path} (vision model, {name}): {text}") from None
    if (why := unsupported(vlm)) is not None:
        raise ModelError(f"{resolved.path} ({name}): {why}", hint="--no-mmproj runs its text model alone")
    token_id, token = _image_token(vlm, processor)
    if decoder is not None:  # only the embedding is read (its rows of a prompt are thrown away)
        _drop_layers(vlm.language_model)
        holder = vlm.language_model if hasattr(vlm.language_model, "embed_tokens") else vlm.language_model.model
        holder.embed_tokens = decoder.model.embed_tokens
        if hasattr(vlm.language_model, "lm_head"):
            vlm.language_model.lm_head = None
    target = VisionTarget(vlm)
    target.make_cache()  # refuses a cache kind rollback does not know, now rather than mid-request
    dtype = str(next(iter(v.dtype for _, v in _leaves(vlm.language_model))))
    mx.eval({k: v for k, v in vlm.parameters().items() if k != "language_model" or decoder is None})
    return (
        target,
        tokenizer,
        Vision(target, processor, token_id, token, name, tokenizer),
        dtype.replace("mlx.core.", ""),
    )


def unsupported(vlm: Any) -> str | None:
    """Why a family's images cannot run here, or None. Image positions must be plain token
    positions: a family that lays them out in several dimensions (mRoPE: Qwen2-VL, Qwen2.5-VL,
    Qwen3-VL, GLM-4V...) keeps per-prompt position state in its language model, which one engine
    model serving many sequences (and rolling them back) cannot share."""
    import inspect

    lm = getattr(vlm, "language_model", None)
    if hasattr(lm, "get_rope_index"):  # mRoPE: positions passed explicitly (vision.target.positions)
        params = inspect.signature(type(lm).__call__).parameters  # position_ids, by name or in **kwargs
        takes = "position_ids" in params or any(p.kind == p.VAR_KEYWORD for p in params.values())
        merge = getattr(getattr(getattr(vlm, "config", None), "vision_config", None), "spatial_merge_size", None)
        if not takes or not isinstance(merge, int):
            return (
                "this family places image positions in several dimensions (mRoPE) in a way mlxcel-py does not carry yet"
            )
        return None
    if any(hasattr(o, a) for o in (vlm, lm) for a in ("_rope_deltas", "_position_ids")):
        return "this family keeps image positions in its language model, which mlxcel-py does not carry yet"
    return None


def _leaves(module: Any):
    from mlx.utils import tree_flatten

    return tree_flatten(module.parameters())


def _image_token(vlm: Any, processor: Any) -> tuple[int, str]:
    cfg = vlm.config
    tid = next(
        (getattr(cfg, k) for k in ("image_token_index", "image_token_id") if isinstance(getattr(cfg, k, None), int)),
        None,
    )
    tok = getattr(processor, "tokenizer", processor)
    text = getattr(processor, "image_token", None)
    if tid is None and isinstance(text, str):
        tid = tok.convert_tokens_to_ids(text)
    if tid is None:
        raise ModelError("this vision model names no image token (image_token_index in config.json)")
    if not isinstance(text, str):
        text = tok.convert_ids_to_tokens(tid)
    return int(tid), text


def text_model(vlm: Any, config: dict) -> Any | None:
    """mlx-lm's model of the VLM's text decoder, holding the VLM's own text weights, where mlx-lm
    has the family and takes input embeddings (so the row-exact kernels run it as they run a text
    model); None where it has not or the weights do not map one to one (mlx-vlm's model runs)."""
    import inspect

    import mlx.nn as nn
    from mlx.utils import tree_flatten, tree_unflatten

    if hasattr(vlm.language_model, "get_rope_index"):  # mRoPE: mlx-lm's decoders take 1-D positions
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else None
    kind = (text or {}).get("model_type")
    source = dict(tree_flatten(vlm.language_model.parameters()))
    # a separate head where the VLM holds one (mlx-vlm builds one whatever the text config says)
    tied = not any(k.startswith("lm_head.") for k in source)
    try:
        module = importlib.import_module(f"mlx_lm.models.{kind}")
        if "input_embeddings" not in inspect.signature(module.Model.__call__).parameters:
            return None
        # the text config as mlx-vlm read it, its defaults filled in (a config that omits rope_theta
        # means mlx-vlm's default for the family, not mlx-lm's)
        read = getattr(vlm.language_model, "config", None)
        known = dict(vars(read)) if read is not None and hasattr(read, "__dict__") else {}
        args = {**known, **text_config(config), "model_type": kind, "tie_word_embeddings": tied}
        args = {**args, **{k: v for k, v in known.items() if k not in (text or {})}}
        model = module.Model(module.ModelArgs.from_dict(args))
    except Exception:  # no such family in mlx-lm, or a config its arguments do not take
        return None
    if (q := config.get("quantization")) is not None:
        quantized = {k.rsplit(".", 1)[0] for k in source if k.endswith(".scales")}
        nn.quantize(
            model,
            group_size=q.get("group_size", 64),
            bits=q.get("bits", 4),
            class_predicate=lambda p, m: (
                hasattr(m, "to_quantized")
                and (p in quantized or "model." + p in quantized or p.removeprefix("model.") in quantized)
            ),
        )
    own = dict(tree_flatten(model.parameters()))
    mapped = {}
    for name, w in source.items():
        key = name if name in own else "model." + name
        if key not in own or own[key].shape != w.shape:
            return None
        mapped[key] = w
    if set(mapped) != set(own):
        return None
    model.update(tree_unflatten(list(mapped.items())))
    _drop_layers(vlm.language_model)  # the text model holds them now (the VLM keeps its embedding)
    return model


def _drop_layers(lm: Any) -> None:
    """Let the VLM's own decoder layers go (only its embedding is read again, for prompts)."""
    for owner in (lm, getattr(lm, "model", None)):
        layers = getattr(owner, "layers", None)
        if isinstance(layers, list):
            layers.clear()
