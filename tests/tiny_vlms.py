"""Tiny random-weight vision-language models of six mlx-vlm families, built from mlx-vlm's own
model classes, with the processor files transformers / mlx-vlm read offline.

Each folder holds: config.json, model.safetensors, a byte-level tokenizer with the family's image
tokens as special tokens, a chat template that places `{"type": "image"}` parts, and the image
processor's and processor's configs (32 px images, 8 px patches). Random weights prove exactness
and mechanics (spec == plain, the same ids as mlx-vlm's own merge), never acceptance.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map
from tiny_models import GEMMA3

BASE_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 256, 257, 258
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}IMAGE{% else %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NORM = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_normalize": True, "do_rescale": True}

LLAMA_TEXT = dict(
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    vocab_size=264,
    max_position_embeddings=2048,
)


def _tokenizer(folder: Path, special: list[str], image_text: str, extra: dict | None = None) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(BASE_SPECIAL + special)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": TEMPLATE.replace("IMAGE", image_text),
        "clean_up_tokenization_spaces": False,
        **(extra or {}),
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def _tower(model_type: str, **extra) -> dict:
    """A two-layer vision tower on 32 px images in 8 px patches (16 patches)."""
    return dict(
        model_type=model_type,
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
        **extra,
    )


def _weights(folder: Path, family: str, cfg: dict, seed: int, scale: float, text: dict | None = None) -> None:
    """Random weights of mlx-vlm's `family` model for `cfg` (`text`: the text config, where the
    family reads it from the config's top level, as Qwen2-VL's does)."""
    module = importlib.import_module(f"mlx_vlm.models.{family}")
    conf = module.ModelConfig.from_dict(dict(cfg))  # Qwen2-VL's from_dict writes into what it is given
    conf.text_config = module.TextConfig.from_dict(text if text is not None else cfg["text_config"])
    conf.vision_config = module.VisionConfig.from_dict(cfg["vision_config"])
    mx.random.seed(seed)
    model = module.Model(conf)
    model.update(tree_map(lambda p: p * scale if p.ndim >= 2 else p, model.parameters()))
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())), {"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(cfg))


def llava(folder: Path, seed: int = 0) -> Path:
    """LLaVA: a CLIP tower, 16 image positions (4x4 patches), a llama text model."""
    folder.mkdir(parents=True, exist_ok=True)
    _tokenizer(folder, ["<image>"], "<image>")  # <image> = 259
    cfg = dict(
        model_type="llava",
        image_token_index=259,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        vocab_size=264,
        text_config=dict(model_type="llama", **LLAMA_TEXT),
        vision_config=_tower("clip_vision_model", projection_dim=32),
    )
    _weights(folder, "llava", cfg, seed, 0.5)
    image = {"size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32}, "do_center_crop": True}
    (folder / "preprocessor_config.json").write_text(
        json.dumps({"image_processor_type": "CLIPImageProcessor", "do_resize": True, "resample": 3, **image, **NORM})
    )
    (folder / "processor_config.json").write_text(
        json.dumps(
            {
                "processor_class": "LlavaProcessor",
                "patch_size": 8,
                "vision_feature_select_strategy": "default",
                "image_token": "<image>",
                "num_additional_image_tokens": 1,
            }
        )
    )
    return folder


def gemma3(folder: Path, seed: int = 0, text: dict | None = None, tied: bool = False) -> Path:
    """Gemma 3: a SigLIP tower pooled to 4 image positions between <start_of_image> and
    <end_of_image>; the text model is tiny_models' GEMMA3, its window 96 (`text`: overrides;
    `tied`: the output layer is the embedding, as a GGUF holds it)."""
    folder.mkdir(parents=True, exist_ok=True)
    special = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]  # 259, 260, 261
    extra = {
        "extra_special_tokens": {
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        }
    }
    _tokenizer(folder, special, "<start_of_image>", extra)
    cfg = dict(
        model_type="gemma3",
        image_token_index=261,
        mm_tokens_per_image=4,
        vocab_size=264,
        hidden_size=64,
        pad_token_id=0,
        # the copy prompts (~125 tokens) wrap the window; the reuse test's do not
        text_config=dict(GEMMA3, vocab_size=264, sliding_window=96, mm_tokens_per_image=4, **(text or {})),
        vision_config=_tower("siglip_vision_model"),
    )
    _weights(folder, "gemma3", cfg, seed, 0.1)
    if tied:
        weights = mx.load(str(folder / "model.safetensors"))
        weights["language_model.lm_head.weight"] = weights["language_model.model.embed_tokens.weight"]
        mx.save_safetensors(str(folder / "model.safetensors"), weights, {"format": "mlx"})
    (folder / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Gemma3ImageProcessor",
                "size": {"height": 32, "width": 32},
                "do_resize": True,
                "do_pan_and_scan": False,
                "resample": 2,
                **NORM,
            }
        )
    )
    (folder / "processor_config.json").write_text(
        json.dumps({"processor_class": "Gemma3Processor", "image_seq_length": 4})
    )
    return folder


def idefics3(folder: Path, seed: int = 0) -> Path:
    """Idefics3 (SmolVLM's layout): a SigLIP tower, pixel shuffle to 4 image positions per
    image, wrapped in <fake_token_around_image><global-img>...; a llama text model."""
    folder.mkdir(parents=True, exist_ok=True)
    special = ["<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"]  # 259..262
    _tokenizer(folder, special, "<image>")
    cfg = dict(
        model_type="idefics3",
        image_token_id=259,
        scale_factor=2,
        vocab_size=264,
        text_config=dict(model_type="llama", **LLAMA_TEXT),
        vision_config=_tower("idefics3_vision"),
    )
    _weights(folder, "idefics3", cfg, seed, 0.5)
    (folder / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Idefics3ImageProcessor",
                "do_resize": True,
                "size": {"longest_edge": 32},
                "max_image_size": {"longest_edge": 32},
                "do_image_splitting": False,
                "do_pad": True,
                "resample": 1,
                **NORM,
            }
        )
    )
    (folder / "processor_config.json").write_text(
        json.dumps({"processor_class": "Idefics3Processor", "image_seq_len": 4})
    )
    return folder


def idefics3_ggufs(folder: Path, out: Path) -> tuple[Path, Path]:
    """The tiny Idefics3 of `folder` as llama.cpp's pair of files: its text model as a llama GGUF
    (float32, Q and K permuted as llama.cpp stores them, the byte-level vocabulary with the image
    tokens) and its vision tower and projector as an mmproj GGUF (`clip`, projector type idefics3),
    every tensor named by gguf-py's maps from its Hugging Face name."""
    import gguf
    import numpy as np
    from gguf_files import _permute

    cfg = json.loads((folder / "config.json").read_text())
    text, vision = cfg["text_config"], cfg["vision_config"]
    weights = {k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(folder / "model.safetensors")).items()}
    out.mkdir(parents=True, exist_ok=True)

    # mlx-vlm's Idefics3 rope base (the config omits it)
    w = _text_writer(out / "text.gguf", "llama", text, [], rope_base=1000000.0)
    special = BASE_SPECIAL + ["<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"]
    _byte_vocab(w, special, "<image>")
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, text["num_hidden_layers"])
    for name, value in weights.items():
        if not name.startswith("language_model."):
            continue
        hf = name.removeprefix("language_model.")
        hf = hf if hf.startswith("lm_head") else "model." + hf
        if ".self_attn.q_proj." in hf:
            value = _permute(value, text["num_attention_heads"])
        elif ".self_attn.k_proj." in hf:
            value = _permute(value, text["num_key_value_heads"])
        w.add_tensor(tmap.get_name(hf, try_suffixes=(".weight", ".bias")), value.astype(np.float32))
    _close(w)

    p = _mmproj_writer(out / "mmproj.gguf", "idefics3", vision, cfg["scale_factor"])
    p.add_vision_preproc_image_size(vision["image_size"])
    vmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, vision["num_hidden_layers"])
    for name, value in weights.items():
        if name.startswith("language_model."):
            continue
        if value.ndim == 4:  # MLX's (out, kh, kw, in) convolution as PyTorch's (out, in, kh, kw)
            value = value.transpose(0, 3, 1, 2)
        p.add_tensor(vmap.get_name("model." + name, try_suffixes=(".weight", ".bias")), value.astype(np.float32))
    _close(p)
    return out / "text.gguf", out / "mmproj.gguf"


def gemma3_ggufs(out: Path) -> tuple[Path, Path, Path]:
    """A tiny Gemma 3 in the shape llama.cpp's gemma3 graph has (every 6th layer global, the head
    tied) as a folder and as llama.cpp's pair of files: (folder, text GGUF, mmproj GGUF). The
    text GGUF stores norms plus one, as llama.cpp's converter writes Gemma's; the projector's
    soft-embedding norm too; the input projection keeps its (vision, text) shape."""
    import gguf
    import numpy as np

    folder = gemma3(out / "folder", text=dict(num_hidden_layers=6, sliding_window_pattern=6), tied=True)
    cfg = json.loads((folder / "config.json").read_text())
    text, vision = cfg["text_config"], cfg["vision_config"]
    weights = {k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(folder / "model.safetensors")).items()}

    extra = [
        ("attention.key_length", text["head_dim"]),
        ("attention.value_length", text["head_dim"]),
        ("attention.sliding_window", text["sliding_window"]),
    ]
    w = _text_writer(out / "text.gguf", "gemma3", text, extra, rope_base=1000000.0)
    special = BASE_SPECIAL + ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]
    _byte_vocab(w, special, "<start_of_image>", size=text["vocab_size"])
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, text["num_hidden_layers"])
    for name, value in weights.items():
        if not name.startswith("language_model.") or name.endswith("lm_head.weight"):  # tied
            continue
        hf = name.removeprefix("language_model.")
        if hf.endswith("norm.weight"):
            value = value + np.float32(1.0)
        w.add_tensor(tmap.get_name(hf, try_suffixes=(".weight", ".bias")), value.astype(np.float32))
    _close(w)

    p = _mmproj_writer(out / "mmproj.gguf", "gemma3", vision, 2)  # 4x4 patches pooled to 2x2: not llama.cpp's 4
    vmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, vision["num_hidden_layers"])
    for name, value in weights.items():
        if name.startswith("language_model."):
            continue
        hf = name.replace("mm_input_projection_weight", "mm_input_projection.weight")
        if value.ndim == 4:
            value = value.transpose(0, 3, 1, 2)
        if "soft_emb_norm.weight" in hf:
            value = value + np.float32(1.0)
        p.add_tensor(vmap.get_name(hf, try_suffixes=(".weight", ".bias")), value.astype(np.float32))
    _close(p)
    return folder, out / "text.gguf", out / "mmproj.gguf"


def _text_writer(path: Path, arch: str, text: dict, extra: list, rope_base: float):
    """A text GGUF writer with the shape keys of `text` (a config's text_config) under `arch`."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    for key, value in [
        ("context_length", text["max_position_embeddings"]),
        ("embedding_length", text["hidden_size"]),
        ("block_count", text["num_hidden_layers"]),
        ("feed_forward_length", text["intermediate_size"]),
        ("attention.head_count", text["num_attention_heads"]),
        ("attention.head_count_kv", text["num_key_value_heads"]),
        *extra,
    ]:
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", text["rms_norm_eps"])
    w.add_float32(f"{arch}.rope.freq_base", rope_base)
    return w


def _byte_vocab(w, special: list[str], image: str, size: int | None = None) -> None:
    """The fixtures' byte-level vocabulary (then `special`, then one merge of two bytes no prompt
    here holds, so it tokenizes as the folder's does; padded with unused tokens to `size`), and the
    chat template with `image` as the image token."""
    from tokenizers import pre_tokenizers

    tokens = sorted(pre_tokenizers.ByteLevel.alphabet()) + special + ["ĀĀ"]
    unused = [f"<unused{i}>" for i in range((size or 0) - len(tokens))]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens + unused)
    w.add_token_types([1] * 256 + [3] * len(special) + [1] + [5] * len(unused))
    w.add_token_merges(["Ā Ā"])
    w.add_eos_token_id(258)  # <|im_end|>
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE.replace("IMAGE", image))


def _mmproj_writer(path: Path, projector: str, vision: dict, scale_factor: int):
    """An mmproj GGUF writer (`clip`) with the vision tower's keys and the processor's norm."""
    import gguf

    p = gguf.GGUFWriter(str(path), "clip")
    p.add_clip_projector_type(projector)
    p.add_clip_has_vision_encoder(True)
    p.add_vision_image_size(vision["image_size"])
    p.add_vision_patch_size(vision["patch_size"])
    p.add_vision_embedding_length(vision["hidden_size"])
    p.add_vision_feed_forward_length(vision["intermediate_size"])
    p.add_vision_block_count(vision["num_hidden_layers"])
    p.add_vision_head_count(vision["num_attention_heads"])
    p.add_vision_attention_layernorm_eps(1e-6)
    p.add_vision_image_mean(NORM["image_mean"])
    p.add_vision_image_std(NORM["image_std"])
    p.add_vision_projector_scale_factor(scale_factor)
    return p


def _close(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


QWEN_IDS = dict(image_token_id=261, video_token_id=262, vision_start_token_id=259, vocab_size=264)  # _qwen_tokenizer's
QWEN_TOWER = dict(depth=2, num_heads=2, patch_size=8, spatial_patch_size=8, spatial_merge_size=2, temporal_patch_size=2)


def qwen2_vl(folder: Path, seed: int = 0) -> Path:
    """Qwen2-VL: multi-dimensional image positions (mRoPE: time, height, width), a 2x2 patch
    merger over 8 px patches of a 64x64-pixel budget (_qwen_processor)."""
    return _qwen2(folder, "qwen2_vl", dict(embed_dim=32, hidden_size=64, mlp_ratio=2), "Qwen2VLProcessor", seed)


def qwen2_5_vl(folder: Path, seed: int = 0) -> Path:
    """Qwen2.5-VL: Qwen2-VL's mRoPE positions; its vision tower attends within 32 px windows
    except in its last block."""
    tower = dict(hidden_size=32, intermediate_size=64, out_hidden_size=64, window_size=32, fullatt_block_indexes=[1])
    return _qwen2(folder, "qwen2_5_vl", tower, "Qwen2_5_VLProcessor", seed)


def _qwen2(folder: Path, family: str, tower: dict, processor: str, seed: int) -> Path:
    """A Qwen2-VL-shaped family: the text config at the config's top level, `tower` the vision
    config beside QWEN_TOWER."""
    folder.mkdir(parents=True, exist_ok=True)
    _qwen_tokenizer(folder)
    text = dict(
        QWEN_IDS,
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    cfg = dict(
        model_type=family,
        **text,
        text_config=dict(model_type=family),
        vision_config=dict(model_type=family, **QWEN_TOWER, **tower),
    )
    _weights(folder, family, cfg, seed, 0.5, text={"model_type": family, **text})
    _qwen_processor(folder, processor)
    return folder


def _qwen_tokenizer(folder: Path) -> None:
    special = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]  # 259..262
    extra = {"extra_special_tokens": {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>"}}
    _tokenizer(folder, special, "<|vision_start|><|image_pad|><|vision_end|>", extra)


def _qwen_processor(folder: Path, processor: str) -> None:
    """Qwen's image processor: an image resized to about 64x64 pixels, in 8 px patches merged 2x2
    (a grid of about 4x4 positions, its shape following the image's)."""
    image = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "min_pixels": 64 * 64,
        "max_pixels": 64 * 64,
        "patch_size": 8,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "do_resize": True,
        **NORM,
    }
    (folder / "preprocessor_config.json").write_text(json.dumps(image))
    (folder / "processor_config.json").write_text(json.dumps({"processor_class": processor}))


def qwen3_vl(folder: Path, seed: int = 0) -> Path:
    """Qwen3-VL: mRoPE positions and deepstack rows (the vision tower's first block's features
    added at the text model's first layer, at the image's positions)."""
    folder.mkdir(parents=True, exist_ok=True)
    _qwen_tokenizer(folder)
    text = dict(
        model_type="qwen3_vl_text",
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        vocab_size=264,
        rope_theta=10000.0,
        max_position_embeddings=2048,
        rope_scaling={"type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True},
        tie_word_embeddings=False,
    )
    cfg = dict(
        model_type="qwen3_vl",
        **QWEN_IDS,
        vision_end_token_id=260,
        text_config=text,
        vision_config=dict(
            model_type="qwen3_vl",
            **QWEN_TOWER,
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=64,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0],
        ),
    )
    _weights(folder, "qwen3_vl", cfg, seed, 0.5)
    _qwen_processor(folder, "Qwen3VLProcessor")
    return folder


FAMILIES = {
    "llava": llava,
    "gemma3": gemma3,
    "idefics3": idefics3,
    "qwen2_vl": qwen2_vl,
    "qwen2_5_vl": qwen2_5_vl,
    "qwen3_vl": qwen3_vl,
}
