"""Write GGUF files from tiny random mlx-lm models the way llama.cpp's converter does.

Names come from gguf-py's own map (`gguf.get_tensor_name_map`), not from the importer's tables;
the layout changes are llama.cpp's (`LlamaModel.permute` on Q/K rows, Gemma's `norm + 1`).
Quantized tensors use gguf-py's quantizers where it has one; K-quant and i-quant blocks (gguf-py
only decodes those) are random bytes with their f16 scale fields set so the decoded weights are
small and finite. `expected` reads the file back with gguf-py's dequantizers and undoes the layout
with this module's own inverse, giving the weights a correct importer must produce.
"""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from mlx.utils import tree_flatten, tree_map

H = 256  # K-quants need rows that are a multiple of 256 values
BASE = dict(
    hidden_size=H,
    num_hidden_layers=2,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    rms_norm_eps=1e-6,
    vocab_size=260,
    max_position_embeddings=2048,
)
CONFIGS = {
    "llama": ("llama", dict(BASE, model_type="llama", tie_word_embeddings=False, rope_theta=10000.0)),
    # Mistral Nemo's quirk: head_dim (32 here) is not hidden / heads; one KV head for four query heads
    "mistral": (
        "llama",
        dict(BASE, model_type="mistral", head_dim=32, num_key_value_heads=1, tie_word_embeddings=False, rope_theta=1e6),
    ),
    "mixtral": (
        "llama",
        dict(
            BASE,
            model_type="mixtral",
            intermediate_size=256,
            num_local_experts=4,
            num_experts_per_tok=2,
            tie_word_embeddings=False,
            rope_theta=1e6,
        ),
    ),
    "qwen2": ("qwen2", dict(BASE, model_type="qwen2", tie_word_embeddings=True, rope_theta=1e6)),
    "qwen3": ("qwen3", dict(BASE, model_type="qwen3", tie_word_embeddings=True, rope_theta=1e6)),
    "qwen3moe": (
        "qwen3moe",
        dict(
            BASE,
            model_type="qwen3_moe",
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=256,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
            tie_word_embeddings=False,
            rope_theta=1e6,
        ),
    ),
    "gemma2": (
        "gemma2",
        dict(
            BASE,
            model_type="gemma2",
            vocab_size=268,
            query_pre_attn_scalar=64,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
            rope_theta=10000.0,
        ),
    ),
    # llama.cpp's gemma3: every 6th layer global, local rope base 10000, queries scaled by head_dim
    "gemma3": (
        "gemma3",
        dict(
            BASE,
            model_type="gemma3_text",
            vocab_size=268,
            query_pre_attn_scalar=64,
            num_hidden_layers=6,
            sliding_window=8,
            sliding_window_pattern=6,
            rope_local_base_freq=10000.0,
            rope_theta=1e6,
        ),
    ),
    "phi3": (
        "phi3",
        dict(
            BASE,
            model_type="phi3",
            tie_word_embeddings=False,
            rope_theta=10000.0,
            max_position_embeddings=4096,
            original_max_position_embeddings=4096,
        ),
    ),
}
NATIVE = [Q.F32, Q.F16, Q.Q4_0, Q.Q4_1, Q.Q8_0]  # MLX reads these itself
DECODED = [
    Q.Q4_K,
    Q.Q6_K,
    Q.Q2_K,
    Q.Q3_K,
    Q.Q5_K,
    Q.IQ4_XS,
    Q.IQ4_NL,
    Q.Q5_0,
    Q.Q5_1,
    Q.BF16,
    Q.IQ2_XXS,
    Q.IQ3_S,
    Q.Q8_0,
    Q.F16,
]
# byte offsets of the f16 scale fields in one block (llama.cpp's block_* structs)
_SCALE_FIELDS = {
    Q.Q2_K: (80, 82),
    Q.Q3_K: (108,),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
    Q.IQ4_XS: (0,),
    Q.IQ4_NL: (0,),
    Q.IQ2_XXS: (0,),
    Q.IQ3_S: (0,),
}
GPT2_MERGES = ["Ġ t", "h e", "Ġt he"]
METADATA = {
    "block_count": "num_hidden_layers",
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.value_length": "head_dim",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
    "rope.dimension_count": "head_dim",
}


def build_model(cfg: dict, seed: int = 0):
    module = importlib.import_module(
        f"mlx_lm.models.{cfg['model_type'] if cfg['model_type'] != 'mistral' else 'llama'}"
    )
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(dict(cfg)))
    model.update(tree_map(lambda p: p * 0.2 if p.ndim >= 2 else p, model.parameters()))
    mx.eval(model.parameters())
    return model


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute`, verbatim in numpy."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _random_blocks(qtype, rows: int, cols: int, rng) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    fields = _SCALE_FIELDS[qtype]

    def set_scale(value: float):
        for off in fields:
            raw[:, :, off : off + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)

    set_scale(1.0)
    peak = np.abs(gguf.quants.dequantize(raw.reshape(rows, -1), qtype)).max()
    set_scale(0.2 / peak)  # decoding is linear in the scales
    return raw.reshape(rows, -1)


def _encode(w: np.ndarray, qtype, rng) -> tuple[np.ndarray, object]:
    if w.shape[-1] % GGML_QUANT_SIZES[qtype][0]:
        qtype = Q.Q8_0  # llama.cpp's fallback for rows a K-quant block does not divide
    return _encode_as(w, qtype, rng), qtype


def _encode_as(w: np.ndarray, qtype, rng) -> np.ndarray:
    if qtype == Q.F32:
        return w.astype(np.float32)
    if qtype == Q.F16:
        return w.astype(np.float16)
    if qtype in _SCALE_FIELDS:
        rows = int(np.prod(w.shape[:-1]))
        return _random_blocks(qtype, rows, w.shape[-1], rng).reshape(*w.shape[:-1], -1)
    return gguf.quants.quantize(w.astype(np.float32), qtype)


def _hf_name(mlx_name: str) -> str:
    # mlx-lm stacks experts in `switch_mlp`; Hugging Face (and gguf-py's map) call the stack `experts`
    return mlx_name.replace(".mlp.switch_mlp.", ".mlp.experts.").replace(
        ".block_sparse_moe.switch_mlp.", ".block_sparse_moe.experts."
    )


_MIXTRAL_EXPERTS = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}


def gguf_name(tmap, mlx_name: str) -> str:
    if ".block_sparse_moe.switch_mlp." in mlx_name:  # gguf-py maps Mixtral's per-expert w1/w2/w3 only
        layer = mlx_name.split(".")[2]
        return f"blk.{layer}.{_MIXTRAL_EXPERTS[mlx_name.split('.')[-2]]}.weight"
    name = tmap.get_name(_hf_name(mlx_name), try_suffixes=(".weight", ".bias"))
    assert name is not None, f"gguf-py has no GGUF name for {mlx_name}"
    return name


def _gpt2_vocab():
    from tokenizers import pre_tokenizers

    tokens = sorted(pre_tokenizers.ByteLevel.alphabet()) + ["Ġt", "he", "Ġthe", "<|endoftext|>"]
    return tokens, [1] * 259 + [3], None


def _spm_vocab():
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokens += ["▁", "t", "h", "e", "▁t", "he", "▁the"]
    types = [3, 3, 3, 2, 4] + [6] * 256 + [1] * 7
    scores = [0.0] * 261 + [-float(i) for i in range(7)]
    return tokens, types, scores


def write(
    path: Path, family: str, kinds: list, *, seed: int = 0, metadata: dict | None = None
) -> tuple[dict, dict[str, np.ndarray], dict]:
    """Write `family`'s tiny model as a GGUF, cycling the 2-D tensors through `kinds`; `metadata`
    overrides what llama.cpp's keys say (a file whose metadata disagrees with its tensors).

    Returns (config, the model's own float32 weights by mlx-lm name, gguf name -> mlx-lm name)."""
    arch, cfg = CONFIGS[family]
    model = build_model(cfg, seed)
    rng = np.random.default_rng(seed)
    tmap = gguf.get_tensor_name_map(
        next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch), cfg["num_hidden_layers"]
    )
    w = gguf.GGUFWriter(str(path), arch)
    p = f"{arch}."
    for key, name in METADATA.items():  # llama.cpp's key names, from the model's config
        value = (metadata or {}).get(key, cfg[name])
        (w.add_float32 if isinstance(cfg[name], float) else w.add_uint32)(p + key, value)
    if "num_experts" in cfg or "num_local_experts" in cfg:
        w.add_uint32(p + "expert_count", cfg.get("num_experts", cfg.get("num_local_experts")))
        w.add_uint32(p + "expert_used_count", cfg["num_experts_per_tok"])
    if "moe_intermediate_size" in cfg:
        w.add_uint32(p + "expert_feed_forward_length", cfg["moe_intermediate_size"])
    if family.startswith("gemma"):
        w.add_uint32(p + "attention.sliding_window", cfg.get("sliding_window", 4096))
    if family == "gemma2":
        w.add_float32(p + "attn_logit_softcapping", cfg["attn_logit_softcapping"])
        w.add_float32(p + "final_logit_softcapping", cfg["final_logit_softcapping"])
    spm = family.startswith("gemma")
    tokens, types, scores = _spm_vocab() if spm else _gpt2_vocab()
    assert len(tokens) == cfg["vocab_size"]
    w.add_tokenizer_model("llama" if spm else "gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    if scores:
        w.add_token_scores(scores)
    else:
        w.add_token_merges(GPT2_MERGES)
    w.add_bos_token_id(2 if spm else 259)
    w.add_eos_token_id(1 if spm else 259)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")

    own = {k: np.array(v.astype(mx.float32)) for k, v in tree_flatten(model.parameters())}
    names: dict[str, str] = {}
    i = 0
    for mlx_name, value in own.items():
        name = gguf_name(tmap, mlx_name)
        names[name] = mlx_name
        if family in ("llama", "mistral", "mixtral") and ".self_attn.q_proj." in mlx_name:
            value = _permute(value, cfg["num_attention_heads"])
        elif family in ("llama", "mistral", "mixtral") and ".self_attn.k_proj." in mlx_name:
            value = _permute(value, cfg["num_key_value_heads"])
        if family.startswith("gemma") and mlx_name.endswith("norm.weight"):
            value = value + np.float32(1.0)
        if value.ndim == 1:
            w.add_tensor(name, value.astype(np.float32))
            continue
        qtype = kinds[i % len(kinds)]
        i += 1
        data, qtype = _encode(value, qtype, rng)
        w.add_tensor(name, data, raw_dtype=qtype if data.dtype == np.uint8 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return cfg, own, names


def expected(path: Path, family: str, names: dict[str, str]) -> dict[str, np.ndarray]:
    """The weights the file holds, decoded by gguf-py and put back in mlx-lm's layout."""
    _, cfg = CONFIGS[family]
    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        value = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        mlx_name = names[t.name]
        for proj, heads in (("q_proj", "num_attention_heads"), ("k_proj", "num_key_value_heads")):
            if family in ("llama", "mistral", "mixtral") and f".self_attn.{proj}." in mlx_name:
                order = _permute(np.arange(shape[0]), cfg[heads])
                value = value[np.argsort(order)]
        if family.startswith("gemma") and mlx_name.endswith("norm.weight"):
            value = value - np.float32(1.0)
        out[mlx_name] = value
    return out


def reference_folder(folder: Path, family: str, weights: dict[str, np.ndarray], tokenizer_from: Path) -> Path:
    """An mlx-lm folder holding `weights` with the test's own config (not the importer's)."""
    from mlx_lm.utils import save_config, save_model

    _, cfg = CONFIGS[family]
    model = build_model(cfg)
    model.load_weights([(k, mx.array(v)) for k, v in weights.items()], strict=True)
    folder.mkdir(parents=True, exist_ok=True)
    save_model(folder, model)
    save_config(dict(cfg), folder / "config.json")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_from / name, folder / name)
    return folder


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


LLAMA_ROTARY = ("llama", "mistral", "mixtral")  # families whose Q/K rows llama.cpp permutes


def write_lora(
    path: Path, family: str, pairs: dict[str, tuple[np.ndarray, np.ndarray]], alpha: float, task_name: str = ""
) -> Path:
    """A GGUF LoRA adapter as llama.cpp's convert_lora_to_gguf.py writes one for `family`'s tiny
    model: `pairs` maps an mlx-lm weight name to (A [rank, in], B [out, rank]) in the model's own
    row order; B's Q/K rows go into the file in llama.cpp's rotary order, as the base's do."""
    arch, cfg = CONFIGS[family]
    tmap = gguf.get_tensor_name_map(
        next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch), cfg["num_hidden_layers"]
    )
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    if task_name:
        w.add_string(gguf.Keys.Adapter.LORA_TASK_NAME, task_name)
    for mlx_name, (a, b) in pairs.items():
        name = gguf_name(tmap, mlx_name)
        for proj, heads in (("q_proj", "num_attention_heads"), ("k_proj", "num_key_value_heads")):
            if family in LLAMA_ROTARY and f".self_attn.{proj}." in mlx_name:
                b = _permute(b, cfg[heads])
        w.add_tensor(f"{name}.lora_a", np.ascontiguousarray(a, dtype=np.float32))
        w.add_tensor(f"{name}.lora_b", np.ascontiguousarray(b, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
