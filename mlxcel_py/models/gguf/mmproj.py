"""llama.cpp's vision projector files (`--mmproj FILE` beside a text `.gguf`), as a folder mlx-vlm reads.

A projector GGUF (architecture `clip`) holds the vision tower and the projector of a vision model
whose text model is the other GGUF. llama.cpp's converter names each tensor by gguf-py's tensor
map from the Hugging Face name, so the map read backwards gives it back: the names are taken from
mlx-vlm's own model of the family (built lazily from the file's metadata; nothing is computed),
each mapped forward to its GGUF name, and every tensor of the file must be one of them and every
one of them in the file. The folder holds the vision weights (float32, in mlx-vlm's layout), a
config.json whose text_config is the converted text model's, the image processor's and the
processor's configs from the file's `clip.vision.*` keys, and the text model's tokenizer (the image
tokens are in a vision model's vocabulary). The text decoder itself stays the text GGUF's
conversion (its quantized weights on the row-exact kernels); models.loading joins the two.

Converted projector types: `idefics3` (SmolVLM, Idefics3) and `gemma3` (Gemma 3). Others are
refused by name.
"""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

from ...errors import ModelError
from .cache import COMPLETE
from .convert import content_key, metadata, publish, read, remove_stale, unwritable

FORMAT = "p3"
FAMILIES = {"idefics3": "idefics3", "gemma3": "gemma3"}  # llama.cpp's projector type -> mlx-vlm family
# the tokens each family's prompt layout needs in the text model's vocabulary
IMAGE_TOKENS = {
    "idefics3": ("<image>", "<fake_token_around_image>", "<global-img>"),
    "gemma3": ("<start_of_image>", "<end_of_image>", "<image_soft_token>"),
}


def projector_dir(mmproj: Path, text_folder: Path, cache_root: Path) -> Path:
    """The folder of this projector beside this text model's conversion (built once)."""
    out = cache_root / "mmproj" / f"{mmproj.stem}-{content_key(mmproj)}-{FORMAT}-{text_folder.name[-24:]}"
    if (out / COMPLETE).is_file():
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(out)
        publish(out, lambda tmp: _build(mmproj, text_folder, tmp))
    except OSError as exc:
        raise unwritable(cache_root, mmproj, exc) from None
    return out


def _build(mmproj: Path, text_folder: Path, out: Path) -> None:
    import gguf
    import mlx.core as mx
    import numpy as np

    reader = read(mmproj)
    md = metadata(reader)
    kind = md.get("clip.projector_type") or md.get("clip.vision.projector_type")
    name = f"--mmproj {mmproj.name}"
    if not md.get("clip.has_vision_encoder", kind is not None):
        raise ModelError(f"{name}: the file holds no vision encoder (an audio projector?)")
    if kind not in FAMILIES:
        raise ModelError(f"{name}: projector type {kind!r} is not converted yet ({' and '.join(FAMILIES)} are)")
    text_cfg = json.loads((text_folder / "config.json").read_text())
    vocab = json.loads((text_folder / "tokenizer.json").read_text())
    wanted = IMAGE_TOKENS[kind]
    ids = {t["content"]: t["id"] for t in vocab.get("added_tokens", [])}
    ids.update({k: v for k, v in vocab.get("model", {}).get("vocab", {}).items() if k in wanted})
    if missing := [t for t in wanted if t not in ids]:
        raise ModelError(f"{name}: the text model's vocabulary has no {missing[0]} token; pass the model's own GGUF")
    try:
        v = "clip.vision."
        tower = dict(
            hidden_size=int(md[v + "embedding_length"]),
            num_hidden_layers=int(md[v + "block_count"]),
            intermediate_size=int(md[v + "feed_forward_length"]),
            num_attention_heads=int(md[v + "attention.head_count"]),
            patch_size=int(md[v + "patch_size"]),
            image_size=int(md[v + "image_size"]),
            layer_norm_eps=float(md.get(v + "attention.layer_norm_epsilon", 1e-6)),
        )
        # llama.cpp's defaults where the key is absent: Idefics3 shuffles 2x2, Gemma 3 pools 4x4
        scale = int(md.get(v + "projector.scale_factor", 2 if kind == "idefics3" else 4))
        mean = [float(x) for x in md.get(v + "image_mean", [0.5, 0.5, 0.5])]
        std = [float(x) for x in md.get(v + "image_std", [0.5, 0.5, 0.5])]
        preproc = int(md.get(v + "preproc_image_size", tower["image_size"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"{name}: its clip.vision metadata is incomplete ({exc})") from None
    text = {k: v for k, v in text_cfg.items() if k not in ("quantization", "quantization_config")}
    side = tower["image_size"] // tower["patch_size"]
    if kind == "idefics3":
        positions = side * side // (scale * scale)
        config = dict(
            model_type="idefics3",
            image_token_id=ids["<image>"],
            scale_factor=scale,
            text_config={**text, "model_type": "llama"},
            vision_config={**tower, "model_type": "idefics3_vision"},
        )
    else:
        positions = (side // scale) ** 2
        config = dict(
            model_type="gemma3",
            image_token_index=ids["<image_soft_token>"],
            mm_tokens_per_image=positions,
            hidden_size=text["hidden_size"],
            pad_token_id=0,
            text_config={**text, "model_type": "gemma3_text", "mm_tokens_per_image": positions},
            vision_config={**tower, "model_type": "siglip_vision_model"},
        )
    config.update(vocab_size=text_cfg["vocab_size"], eos_token_id=text_cfg.get("eos_token_id"))
    expected = _names(config)
    weights = {}
    for t in reader.tensors:
        mlx_name = expected.get(t.name)
        if mlx_name is None:
            raise ModelError(f"{name}: tensor {t.name} is not one of an {kind} projector's; the file is not {kind}'s")
        shape = tuple(int(d) for d in reversed(t.shape))
        value = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        if value.ndim == 4:  # a convolution, stored as PyTorch's (out, in, kh, kw): MLX's is (out, kh, kw, in)
            value = value.transpose(0, 2, 3, 1)
        if mlx_name.endswith("mm_soft_emb_norm.weight"):  # llama.cpp stores Gemma's norms plus one
            value = value - np.float32(1.0)
        weights[mlx_name] = mx.array(value)
    if missing := sorted(set(expected.values()) - set(weights)):
        raise ModelError(f"{name}: the file lacks {missing[0]} (and {len(missing) - 1} more) of an {kind} projector")
    if kind == "gemma3":  # mlx-vlm's Gemma 3 loader copies the embedding into the head on load, so
        # one must be there; vision.loading puts the text model's own in its place
        weights["language_model.model.embed_tokens.weight"] = mx.zeros((1, 1))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    norm = {"image_mean": mean, "image_std": std, "do_normalize": True, "do_rescale": True}
    if kind == "idefics3":
        image = {
            "image_processor_type": "Idefics3ImageProcessor",
            "do_resize": True,
            "size": {"longest_edge": preproc},
            "max_image_size": {"longest_edge": tower["image_size"]},
            "do_image_splitting": preproc > tower["image_size"],
            "do_pad": True,
            "resample": 1,
            **norm,
        }
        processor = {"processor_class": "Idefics3Processor", "image_seq_len": positions}
    else:
        size = tower["image_size"]
        image = {
            "image_processor_type": "Gemma3ImageProcessor",
            "size": {"height": size, "width": size},
            "do_resize": True,
            "do_pan_and_scan": False,
            "resample": 2,
            **norm,
        }
        processor = {"processor_class": "Gemma3Processor", "image_seq_length": positions}
    (out / "preprocessor_config.json").write_text(json.dumps(image, indent=2))
    (out / "processor_config.json").write_text(json.dumps(processor))
    shutil.copy(text_folder / "tokenizer.json", out / "tokenizer.json")
    tok_config = json.loads((text_folder / "tokenizer_config.json").read_text())
    if kind == "gemma3":  # Gemma 3's processor reads these from its tokenizer
        tok_config["extra_special_tokens"] = {
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    (out / "SOURCE").write_text(f"converted from {mmproj}, beside {text_folder}\n")


def _names(config: dict) -> dict[str, str]:
    """GGUF name -> mlx-vlm name of every vision and projector tensor of the family."""
    import gguf
    from mlx.utils import tree_flatten

    module = importlib.import_module(f"mlx_vlm.models.{config['model_type']}")
    conf = module.ModelConfig.from_dict(dict(config))
    conf.vision_config = module.VisionConfig.from_dict(config["vision_config"])
    conf.text_config = module.TextConfig.from_dict(config["text_config"])
    parts = {}
    model = module.Model(conf)  # lazy: its parameters are never computed, only their names read
    for child, part in model.children().items():
        if child != "language_model":  # the text model is the other file's
            parts.update({f"{child}.{k}": v for k, v in tree_flatten(part.parameters())})
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, config["vision_config"]["num_hidden_layers"])
    out = {}
    for mlx_name in parts:
        # Hugging Face's name, as llama.cpp's converter read it (Idefics3's sit under `model.`;
        # Gemma 3's projector weight is a bare parameter, named `.weight` by the converter)
        hf = ("model." + mlx_name) if config["model_type"] == "idefics3" else mlx_name
        hf = hf.replace("mm_input_projection_weight", "mm_input_projection.weight")
        gguf_name = tmap.get_name(hf, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ModelError(f"gguf-py has no projector name for {hf}")
        out[gguf_name] = mlx_name
    return out
