"""Tiny random-weight models of the families whose caches a trim cannot roll back.

Each config is the smallest one the pinned mlx-lm builds; weights are scaled so greedy output
wanders instead of collapsing to one repeated token (random weights prove exactness and
mechanics, never acceptance rates). `build` writes a folder that `mlx_lm.load` reads offline.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map

QWEN35 = dict(
    model_type="qwen3_5",
    hidden_size=64,
    num_hidden_layers=4,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    full_attention_interval=4,
    vocab_size=260,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    max_position_embeddings=2048,
    rope_parameters=dict(type="default", rope_theta=10000.0, partial_rotary_factor=0.5, mrope_section=[2, 1, 1]),
)
# the window (8) is far shorter than the prompts, so the rotating caches wrap
GEMMA3 = dict(
    model_type="gemma3_text",
    hidden_size=64,
    num_hidden_layers=3,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=260,
    rms_norm_eps=1e-6,
    sliding_window=8,
    sliding_window_pattern=3,
    max_position_embeddings=2048,
    query_pre_attn_scalar=16,
)
MAMBA = dict(
    model_type="mamba",
    vocab_size=260,
    hidden_size=64,
    intermediate_size=128,
    state_size=8,
    num_hidden_layers=2,
    conv_kernel=4,
    use_bias=False,
    use_conv_bias=True,
    time_step_rank=8,
    tie_word_embeddings=False,
)
LFM2 = dict(
    model_type="lfm2",
    vocab_size=260,
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    norm_eps=1e-5,
    conv_bias=False,
    conv_L_cache=3,
    block_dim=64,
    block_ff_dim=128,
    block_multiple_of=16,
    block_ffn_dim_multiplier=1.0,
    block_auto_adjust_ff_dim=False,
    full_attn_idxs=[2],
    rope_theta=10000.0,
)
# recurrent layers (state) and local attention (rotating window) in one model
RECURRENT_GEMMA = dict(
    model_type="recurrent_gemma",
    attention_bias=False,
    conv1d_width=4,
    hidden_size=64,
    intermediate_size=128,
    logits_soft_cap=30.0,
    num_attention_heads=4,
    num_hidden_layers=3,
    num_key_value_heads=1,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    attention_window_size=8,
    vocab_size=260,
    block_types=["recurrent", "recurrent", "attention"],
    lru_width=64,
    embeddings_scale_by_sqrt_dim=True,
    final_w_init_variance_scale=1.0,
    partial_rotary_factor=0.5,
)
RWKV7 = dict(
    model_type="rwkv7",
    vocab_size=260,
    hidden_size=64,
    intermediate_size=128,
    norm_eps=1e-5,
    head_dim=16,
    num_hidden_layers=2,
    a_low_rank_dim=8,
    v_low_rank_dim=8,
    gate_low_rank_dim=8,
    decay_low_rank_dim=8,
    tie_word_embeddings=False,
)

# every layer a CacheList of a Mamba-2 state (ArraysCache) and attention (KVCache)
FALCON_H1 = dict(
    model_type="falcon_h1",
    hidden_size=64,
    head_dim=16,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    vocab_size=260,
    mamba_d_conv=4,
    mamba_d_head=16,
    mamba_d_ssm=64,
    mamba_d_state=8,
    mamba_n_heads=4,
    mamba_n_groups=1,
    mamba_chunk_size=16,
    max_position_embeddings=2048,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)

FAMILIES = {
    "qwen3_5": QWEN35,
    "gemma3_text": GEMMA3,
    "mamba": MAMBA,
    "lfm2": LFM2,
    "recurrent_gemma": RECURRENT_GEMMA,
    "rwkv7": RWKV7,
    "falcon_h1": FALCON_H1,
}
# weight scale per family (0.2 otherwise): Gemma's scaled embeddings make its greedy output chaotic
# at 0.2, so prompt lookup's drafts would never be accepted; Qwen3.5 collapses to one token below 1.0.
# An untied head keeps Mamba from echoing its input token (LFM2 always ties, and echoes).
SCALES = {"gemma3_text": 0.1, "qwen3_5": 1.0, "falcon_h1": 0.5}


def build(folder: Path, cfg: dict, *, seed: int = 0, scale: float | None = None, extra: dict | None = None) -> Path:
    """Write a random model of `cfg` (plus `extra` tensors, e.g. an MTP head) to `folder`."""
    from conftest import write_byte_tokenizer
    from mlx_lm.utils import save_config, save_model

    scale = SCALES.get(cfg["model_type"], 0.2) if scale is None else scale
    folder.mkdir(parents=True, exist_ok=True)
    module = importlib.import_module(f"mlx_lm.models.{cfg['model_type']}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(dict(cfg)))
    model.update(tree_map(lambda p: p * scale if p.ndim >= 2 else p, model.parameters()))
    mx.eval(model.parameters())
    save_model(folder, model)
    if extra:
        weights = dict(tree_flatten(model.parameters()))
        weights.update(extra)
        for f in folder.glob("*.safetensors"):
            f.unlink()
        mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
        (folder / "model.safetensors.index.json").unlink(missing_ok=True)
    save_config(dict(cfg), folder / "config.json")
    write_byte_tokenizer(folder)
    return folder


def mtp_tensors(cfg: dict, *, kind: str = "random", seed: int = 3, prefix: str = "mtp.", noise: float = 0.0) -> dict:
    """A Qwen3.5 MTP head's tensors, named as the checkpoint names them (`mtp.fc.weight`...).

    kind "random": random weights (its drafts are nearly always rejected). kind "echo": the head
    passes the target's hidden state through (fc = [0 | I], attention and MLP outputs zeroed), so
    it predicts the token the target just predicted: right whenever the output repeats itself;
    `noise` perturbs that pass-through, so its distribution q is near the target's p, not equal.
    """
    from mlxcel_py.drafters.mtp import MTPHead

    mx.random.seed(seed)
    head = MTPHead(dict(cfg))
    params = dict(tree_flatten(head.parameters()))
    if kind == "echo":
        H = cfg["hidden_size"]
        params["fc.weight"] = mx.concatenate([mx.zeros((H, H)), mx.eye(H) + noise * mx.random.normal((H, H))], axis=1)
        for name in params:
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                params[name] = mx.zeros_like(params[name])
    else:
        params = {k: (v * 0.2 if v.ndim >= 2 else v) for k, v in params.items()}
    return {prefix + k: v for k, v in params.items()}


def build_mtp_checkpoint(folder: Path, target_cfg: dict, *, kind: str = "echo", config: dict | None = None) -> Path:
    """A separate head-only checkpoint (config model_type qwen3_5_mtp), as --draft-model DIR."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = mtp_tensors(target_cfg, kind=kind)
    mx.save_safetensors(str(folder / "model.safetensors"), tensors, metadata={"format": "mlx"})
    cfg = {
        "model_type": "qwen3_5_mtp",
        "hidden_size": target_cfg["hidden_size"],
        "vocab_size": target_cfg["vocab_size"],
        **(config or {}),
    }
    (folder / "config.json").write_text(__import__("json").dumps(cfg))
    return folder


# Gemma 4: two layers hold K/V (one sliding, one full), the other two read theirs (KV sharing)
GEMMA4 = dict(
    model_type="gemma4_text",
    hidden_size=64,
    num_hidden_layers=4,
    intermediate_size=128,
    num_attention_heads=4,
    head_dim=16,
    global_head_dim=16,
    num_key_value_heads=2,
    num_kv_shared_layers=2,
    hidden_size_per_layer_input=0,
    vocab_size=260,
    vocab_size_per_layer_input=260,
    sliding_window=8,
    max_position_embeddings=2048,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    use_double_wide_mlp=False,
    tie_word_embeddings=True,
)


def gemma4_assistant_checkpoint(
    folder: Path,
    target_folder: Path,
    *,
    kind: str = "echo",
    ordered: bool = False,
    noise: float = 0.0,
    config: dict | None = None,
) -> Path:
    """A Gemma 4 assistant for the GEMMA4 target in `target_folder`, as --draft-model DIR.

    kind "echo": hidden size = the backbone's, pre_projection passes the target's hidden state
    through, the layers add nothing and the lm_head is the target's embedding: it predicts the token
    the target just predicted. kind "random": random weights. `ordered` adds a centroid-routed
    sparse lm_head (4 clusters of 65 tokens, top 2)."""
    import json

    from mlxcel_py.drafters.gemma4_assistant import Gemma4Assistant

    folder.mkdir(parents=True, exist_ok=True)
    text = dict(
        GEMMA4, num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], num_kv_shared_layers=0
    )
    cfg = {
        "model_type": "gemma4_assistant",
        "backbone_hidden_size": GEMMA4["hidden_size"],
        "tie_word_embeddings": True,
        "use_ordered_embeddings": ordered,
        "num_centroids": 4,
        "centroid_intermediate_top_k": 2,
        "block_size": 3,
        "text_config": text,
        **(config or {}),
    }
    mx.random.seed(11)
    head = Gemma4Assistant(cfg)
    params = dict(tree_flatten(head.parameters()))
    if ordered:
        params["masked_embedding.token_ordering"] = mx.random.permutation(GEMMA4["vocab_size"]).astype(mx.int64)
    if kind == "echo":
        H = GEMMA4["hidden_size"]
        params["pre_projection.weight"] = mx.concatenate(
            [mx.zeros((H, H)), mx.eye(H) + noise * mx.random.normal((H, H))], axis=1
        )
        for name in params:
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                params[name] = mx.zeros_like(params[name])
        target = mx.load(str(next(target_folder.glob("*.safetensors"))))
        params["model.embed_tokens.weight"] = next(v for k, v in target.items() if k.endswith("embed_tokens.weight"))
    else:
        params = {k: (v * 0.2 if v.ndim >= 2 else v) for k, v in params.items()}
    mx.save_safetensors(str(folder / "model.safetensors"), params, metadata={"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


# a plain Qwen3 (per-head q/k norms): the family DFlash drafters are published for
QWEN3 = dict(
    model_type="qwen3",
    hidden_size=64,
    num_hidden_layers=4,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-6,
    vocab_size=260,
    tie_word_embeddings=True,
    max_position_embeddings=2048,
    rope_theta=10000.0,
)


def dflash_config(
    target_cfg: dict,
    *,
    layers: int = 1,
    ids=None,
    block: int | None = 8,
    nested: bool = False,
    mask: int = 259,
    **extra,
) -> dict:
    """A DFlash drafter's config.json for `target_cfg`, in z-lab's layout: `block_size` at the top
    (Qwen3) or inside dflash_config (`nested`, Qwen3.5)."""
    t = {**target_cfg, **(target_cfg.get("text_config") or {})}
    n = t["num_hidden_layers"]
    ids = list(ids) if ids is not None else [min(1, n - 1), n - 2][:layers] if layers > 1 else [n // 2]
    dcfg = {"mask_token_id": mask, "target_layer_ids": ids}
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": t["hidden_size"],
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 2 * t["hidden_size"],
        "vocab_size": t["vocab_size"],
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "num_target_layers": n,
        "dflash_config": dcfg,
    }
    if block is not None:
        (dcfg if nested else cfg)["block_size"] = block
    cfg.update(extra)
    return cfg


def dflash_checkpoint(
    folder: Path, cfg: dict, *, seed: int = 5, scale: float = 0.3, params: dict | None = None
) -> Path:
    """Write a DFlash drafter (config.json + model.safetensors, no embedding or lm_head): random
    weights, or `params` (a trained network's)."""
    import json

    from mlxcel_py.drafters.dflash import read_spec
    from mlxcel_py.drafters.dflash_net import DFlashNet

    folder.mkdir(parents=True, exist_ok=True)
    if params is None:
        mx.random.seed(seed)
        net = DFlashNet(read_spec(cfg, folder, cfg["num_target_layers"]))
        params = {k: (v * scale if v.ndim >= 2 else v) for k, v in tree_flatten(net.parameters())}
    mx.save_safetensors(str(folder / "model.safetensors"), dict(params), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


PATTERN_LO, PATTERN_M = 100, 16  # the synthetic pattern's tokens: LO .. LO+M-1


def pattern(rng, n: int, lo: int = PATTERN_LO) -> list[int]:
    """A synthetic sequence for trained-drafter tests. Second order: each token depends on the two
    before it, so a drafter must read the context (the target's hidden states), not only the
    last token."""
    m = PATTERN_M
    seq = [rng.randrange(m), rng.randrange(m)]
    while len(seq) < n:
        seq.append((3 * seq[-1] + 5 * seq[-2] + 1) % m)
    return [lo + t for t in seq]


def train_target(model, rng, *, steps: int, lr: float, batch: int = 8, length: int = 32, make=None) -> float:
    """Train `model` (an mlx-lm model) on `pattern` (or `make(rng)`'s sequences, one length) for
    next-token prediction; its last loss."""
    import mlx.nn as nn
    import mlx.optimizers as optim

    opt = optim.AdamW(lr)

    def loss_fn(m, x):
        return nn.losses.cross_entropy(m(x[:, :-1]), x[:, 1:]).mean()

    step = nn.value_and_grad(model, loss_fn)
    for _ in range(steps):
        rows = [make(rng) if make else pattern(rng, length) for _ in range(batch)]
        loss, grads = step(model, mx.array(rows))
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state)
    return loss.item()


def eagle3_config(
    target_cfg: dict, *, ids=(1, 2, 3), draft_vocab: int | None = 200, speculators: bool = False, **extra
) -> dict:
    """An EAGLE-3 drafter's config.json for `target_cfg`: EAGLE's own layout
    (LlamaForCausalLMEagle3) or vLLM speculators' (Eagle3Speculator, transformer_layer_config)."""
    t = {**target_cfg, **(target_cfg.get("text_config") or {})}
    layer = {
        "model_type": "llama",
        "hidden_size": t["hidden_size"],
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 2 * t["hidden_size"],
        "vocab_size": t["vocab_size"],
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
    }
    dv = {"draft_vocab_size": draft_vocab} if draft_vocab else {}
    if speculators:
        cfg = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": layer,
            "speculators_config": {"algorithm": "eagle3", "num_speculative_tokens": 3},
            "eagle_aux_hidden_state_layer_ids": list(ids),
            **dv,
        }
    else:
        cfg = {
            "architectures": ["LlamaForCausalLMEagle3"],
            **layer,
            **dv,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ids)},
        }
    cfg.update(extra)
    return cfg


def eagle3_checkpoint(
    folder: Path, cfg: dict, *, seed: int = 6, scale: float = 0.3, params: dict | None = None, draft_ids=None
) -> Path:
    """Write an EAGLE-3 drafter: random weights (or a trained network's `params`), a d2t mapping the
    draft vocabulary onto `draft_ids` (default: target ids spread evenly), speculators names
    (`layers.0.`) when the config is in that layout."""
    import json

    from mlxcel_py.drafters.eagle3 import read_spec
    from mlxcel_py.drafters.eagle3_net import Eagle3Net

    folder.mkdir(parents=True, exist_ok=True)
    spec = read_spec(cfg, folder, 4)
    if params is None:
        mx.random.seed(seed)
        net = Eagle3Net(spec)
        params = {k: (v * scale if v.ndim >= 2 else v) for k, v in tree_flatten(net.parameters()) if k != "d2t"}
    params = {k: v for k, v in params.items() if k != "d2t"}
    if spec.draft_vocab_size != spec.vocab_size or draft_ids is not None:
        V, Vd = spec.vocab_size, spec.draft_vocab_size
        ids = list(draft_ids) if draft_ids is not None else [i * V // Vd for i in range(Vd)]
        params["d2t"] = mx.array([t - d for d, t in enumerate(ids)], dtype=mx.int64)
    if "transformer_layer_config" in cfg:
        params = {
            ("layers.0." + k[len("midlayer.") :] if k.startswith("midlayer.") else k): v for k, v in params.items()
        }
    mx.save_safetensors(str(folder / "model.safetensors"), dict(params), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder
