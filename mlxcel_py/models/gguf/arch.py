"""GGUF architectures: llama.cpp's tensor names and metadata keys -> an mlx-lm model folder.

Each `Arch` says which mlx-lm `model_type` runs the file, how its `config.json` is read from the
metadata (`<arch>.<key>`, llama.cpp's key names), which `blk.N.<name>` maps to which mlx-lm
parameter, and which layout changes llama.cpp's converter made that must be undone here:
- llama / mistral: Q and K rows permuted for llama.cpp's interleaved rotary (`permute_qk`);
- Gemma 2 / 3: every `*norm.weight` stored as 1 + w, because llama.cpp's RMSNorm multiplies by the
  stored value while Gemma's multiplies by 1 + w (`norm_shift`);
- Gemma's `ffn_norm` is the pre-feed-forward norm, not llama's post-attention norm (name table);
- Phi-3 keeps its fused `qkv_proj` and `gate_up_proj`, as mlx-lm's phi3 does.
mlx-lm's parameter names are Hugging Face's; the tests check these tables against gguf-py's own
name map (`gguf.TensorNameMap`), the one llama.cpp's converter writes with.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...errors import ModelError

_REQUIRED = object()

_LLAMA_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_QK_NORM = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_GEMMA_NORMS = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_MOE = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.switch_mlp.gate_proj",
    "ffn_up_exps": "mlp.switch_mlp.up_proj",
    "ffn_down_exps": "mlp.switch_mlp.down_proj",
}
_PHI3_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_up": "mlp.gate_up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


class Meta:
    """The metadata of one file, read with the architecture's prefix and clear errors."""

    def __init__(self, md: dict, arch: str, path: Any, vectors: dict | None = None):
        self.md, self.arch, self.path = md, arch, path
        self.vectors = vectors or {}  # small 1-D tensors that hold configuration (rotary factors)

    def raw(self, key: str, default: Any = _REQUIRED) -> Any:
        if key in self.md:
            return self.md[key]
        if default is _REQUIRED:
            raise ModelError(
                f"{self.path}: GGUF metadata has no '{key}', so the file is not a complete {self.arch} model"
            )
        return default

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        return self.raw(f"{self.arch}.{key}", default)


@dataclass(frozen=True)
class Arch:
    model_type: str
    layer_names: dict[str, str]
    config: Callable[[Meta, dict], dict]
    permute_qk: bool = False
    norm_shift: float = 0.0  # stored norm weight = w + norm_shift
    ignored: frozenset[str] = field(default_factory=frozenset)  # tensors the mlx-lm model recomputes

    def mlx_name(self, gguf_name: str) -> str | None:
        base, _, suffix = gguf_name.rpartition(".")  # weight | bias
        if base in TOP_NAMES:
            return f"{TOP_NAMES[base]}.{suffix}"
        parts = base.split(".")
        if len(parts) == 3 and parts[0] == "blk" and parts[2] in self.layer_names:
            return f"model.layers.{parts[1]}.{self.layer_names[parts[2]]}.{suffix}"
        return None


def _common(m: Meta, shape: dict) -> dict:
    """The keys every decoder-only architecture in llama.cpp writes the same way."""
    hidden = int(m.get("embedding_length"))
    heads = int(m.get("attention.head_count"))
    vocab = m.get("vocab_size", None)
    if vocab is None:
        tokens = m.raw("tokenizer.ggml.tokens", None)
        vocab = len(tokens) if tokens else shape["token_embd.weight"][0]
    return {
        "hidden_size": hidden,
        "num_hidden_layers": int(m.get("block_count")),
        "intermediate_size": int(m.get("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(m.get("attention.head_count_kv", heads)),
        "head_dim": int(m.get("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(m.get("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(m.get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(m.get("context_length", 2048)),
        "vocab_size": int(vocab),
        "tie_word_embeddings": "output.weight" not in shape,
    }


def _llama(m: Meta, shape: dict) -> dict:
    cfg = _common(m, shape)
    scaling = _llama3_rope_scaling(m, cfg, shape)
    if scaling:
        cfg["rope_scaling"] = scaling
    return cfg


def _llama3_rope_scaling(m: Meta, cfg: dict, shape: dict) -> dict | None:
    """Llama 3.1+ files carry their rotary scaling only as the `rope_freqs` tensor (one factor per
    frequency). mlx-lm wants llama3's parameters; the released models use the ones tried here, and a
    tensor matching none of them is refused rather than ignored (it changes every position)."""
    factors = m.vectors.get("rope_freqs.weight")
    if factors is None:
        return None
    dim = cfg["head_dim"]
    base = cfg["rope_theta"]
    for factor in (8.0, 16.0, 32.0, 4.0, 2.0):
        for original in (8192, 4096, 2048):
            expected = _llama3_factors(base, dim, factor, 1.0, 4.0, original)
            if len(expected) == len(factors) and all(
                math.isclose(a, b, rel_tol=1e-3) for a, b in zip(expected, factors)
            ):
                return {
                    "rope_type": "llama3",
                    "factor": factor,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": original,
                }
    raise ModelError(
        f"{m.path}: its rope_freqs tensor matches no llama3 rotary scaling mlx-lm knows",
        hint="convert the original Hugging Face model with mlx_lm.convert instead",
    )


def _llama3_factors(base: float, dim: int, factor: float, low: float, high: float, original: int) -> list[float]:
    """The per-frequency divisors llama.cpp's converter writes as `rope_freqs` for llama3 scaling."""
    low_wavelen, high_wavelen = original / low, original / high
    out = []
    for i in range(0, dim, 2):
        freq = 1.0 / base ** (i / dim)
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return out


def _qwen3_moe(m: Meta, shape: dict) -> dict:
    cfg = _common(m, shape)
    cfg.update(
        num_experts=int(m.get("expert_count")),
        num_experts_per_tok=int(m.get("expert_used_count")),
        moe_intermediate_size=int(m.get("expert_feed_forward_length")),
        decoder_sparse_step=1,
        mlp_only_layers=[],
        # llama.cpp's qwen3moe graph always renormalises the top-k weights
        norm_topk_prob=True,
    )
    return cfg


def _gemma_scale(m: Meta, cfg: dict) -> int:
    # llama.cpp scales queries by 1/sqrt(hidden/heads) for the 27B models and 1/sqrt(head_dim) otherwise;
    # the 27B models are the ones with 46 (Gemma 2) and 62 (Gemma 3) blocks.
    if cfg["num_hidden_layers"] in (46, 62) and cfg["hidden_size"] >= 4608:
        return cfg["hidden_size"] // cfg["num_attention_heads"]
    return cfg["head_dim"]


def _gemma2(m: Meta, shape: dict) -> dict:
    cfg = _common(m, shape)
    cfg.update(
        query_pre_attn_scalar=_gemma_scale(m, cfg),
        attn_logit_softcapping=float(m.get("attn_logit_softcapping", 50.0)),
        final_logit_softcapping=float(m.get("final_logit_softcapping", 30.0)),
    )
    cfg.pop("tie_word_embeddings")  # Gemma always ties; mlx-lm's gemma2 has no lm_head
    return cfg


def _gemma3(m: Meta, shape: dict) -> dict:
    cfg = _common(m, shape)
    cfg.update(
        query_pre_attn_scalar=_gemma_scale(m, cfg),
        sliding_window=int(m.get("attention.sliding_window", 512)),
        sliding_window_pattern=6,  # llama.cpp's gemma3 graph: every 6th layer global
        rope_local_base_freq=10000.0,
    )
    kind = m.get("rope.scaling.type", None)
    if kind == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(m.get("rope.scaling.factor"))}
    cfg.pop("tie_word_embeddings")
    return cfg


def _phi3(m: Meta, shape: dict) -> dict:
    cfg = _common(m, shape)
    cfg.pop("head_dim")
    rot = m.get("rope.dimension_count", None)
    if rot:
        cfg["partial_rotary_factor"] = int(rot) / (cfg["hidden_size"] // cfg["num_attention_heads"])
    original = m.get("rope.scaling.original_context_length", None)
    if original:
        cfg["original_max_position_embeddings"] = int(original)
    long_f, short_f = m.vectors.get("rope_factors_long.weight"), m.vectors.get("rope_factors_short.weight")
    if long_f is not None and short_f is not None:
        cfg["rope_scaling"] = {"type": "longrope", "long_factor": list(long_f), "short_factor": list(short_f)}
    return cfg


ARCHITECTURES: dict[str, Arch] = {
    "llama": Arch("llama", _LLAMA_LAYER, _llama, permute_qk=True, ignored=frozenset({"rope_freqs.weight"})),
    "qwen2": Arch("qwen2", _LLAMA_LAYER, _common),
    "qwen3": Arch("qwen3", {**_LLAMA_LAYER, **_QK_NORM}, _common),
    "qwen3moe": Arch(
        "qwen3_moe",
        {**{k: v for k, v in _LLAMA_LAYER.items() if not k.startswith("ffn_") or k == "ffn_norm"}, **_QK_NORM, **_MOE},
        _qwen3_moe,
    ),
    "gemma2": Arch(
        "gemma2", {**_LLAMA_LAYER, **_GEMMA_NORMS}, _gemma2, norm_shift=1.0, ignored=frozenset({"output.weight"})
    ),
    "gemma3": Arch(
        "gemma3_text",
        {**_LLAMA_LAYER, **_GEMMA_NORMS, **_QK_NORM},
        _gemma3,
        norm_shift=1.0,
        ignored=frozenset({"output.weight"}),
    ),
    "phi3": Arch(
        "phi3", _PHI3_LAYER, _phi3, ignored=frozenset({"rope_factors_long.weight", "rope_factors_short.weight"})
    ),
}
SUPPORTED = tuple(ARCHITECTURES)  # "llama" covers Mistral and Mixtral files too


# Mistral and Mixtral files say "llama" (llama.cpp's converter writes them as llama); a llama file
# with experts runs as mlx-lm's mixtral, whose MoE block has its own parameter names.
_MIXTRAL = Arch(
    "mixtral",
    {
        **{k: v for k, v in _LLAMA_LAYER.items() if not k.startswith("ffn_") or k == "ffn_norm"},
        "ffn_gate_inp": "block_sparse_moe.gate",
        "ffn_gate_exps": "block_sparse_moe.switch_mlp.gate_proj",
        "ffn_up_exps": "block_sparse_moe.switch_mlp.up_proj",
        "ffn_down_exps": "block_sparse_moe.switch_mlp.down_proj",
    },
    lambda m, shape: {
        **_llama(m, shape),
        "num_local_experts": int(m.get("expert_count")),
        "num_experts_per_tok": int(m.get("expert_used_count")),
    },
    permute_qk=True,
    ignored=frozenset({"rope_freqs.weight"}),
)


def lookup(arch: str, path: Any, md: dict | None = None) -> Arch:
    if arch == "llama" and md and int(md.get("llama.expert_count", 0) or 0) > 0:
        return _MIXTRAL
    if arch not in ARCHITECTURES:
        raise ModelError(
            f"{path}: GGUF architecture '{arch}' is not supported; supported: {', '.join(SUPPORTED)}",
            hint="convert the original Hugging Face model with mlx_lm.convert and pass that folder",
        )
    return ARCHITECTURES[arch]
