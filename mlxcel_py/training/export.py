"""A trained drafter, written where other runtimes read it: vLLM speculators' EAGLE-3 layout
(`Eagle3Speculator`, a `transformer_layer_config`, tensors `layers.0.*`, `fc`, `norm`, `lm_head`,
and `d2t`/`t2d` for the reduced draft vocabulary), which drafters/eagle3.py loads too.

Beside it, `mlxcel_card.json` names the target (its path and fingerprint, models/fingerprint.py)
and how the drafter was trained and measured; `--draft-model DIR` refuses the folder for any
other target (drafters/checkpoints.check_card). README.md says the same for people.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from ..drafters.checkpoints import CARD
from ..drafters.eagle3_net import Eagle3Net


def layer_config(spec: Any, target_cfg: dict) -> dict:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": 1,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_size,
        "vocab_size": spec.vocab_size,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "rope_scaling": spec.rope_scaling,
        "max_position_embeddings": spec.max_position_embeddings,
        "attention_bias": False,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    }


def config(spec: Any, target_cfg: dict, target_name: str, width: int) -> dict:
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer_config(spec, target_cfg),
        "draft_vocab_size": spec.draft_vocab_size,
        "norm_before_residual": spec.norm_before_residual,
        "target_hidden_size": spec.hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(spec.aux_layer_ids),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": width}],
            "num_speculative_tokens": width,
            "verifier": {"name_or_path": target_name, "architectures": target_cfg.get("architectures") or []},
        },
        "torch_dtype": "bfloat16",
    }


def tensors(net: Eagle3Net, draft_ids: list[int], vocab_size: int) -> dict[str, mx.array]:
    out = {}
    for name, value in tree_flatten(net.parameters()):
        if name == "d2t":
            continue
        stored = "layers.0." + name[len("midlayer.") :] if name.startswith("midlayer.") else name
        out[stored] = value.astype(mx.bfloat16)
    ids = mx.array(draft_ids, dtype=mx.int64)
    out["d2t"] = ids - mx.arange(len(draft_ids), dtype=mx.int64)
    t2d = mx.zeros((vocab_size,), dtype=mx.bool_)
    t2d[ids] = True
    out["t2d"] = t2d
    return out


def write(folder: Path, cfg: dict, weights: dict[str, mx.array], card: dict, readme: str) -> None:
    """Weights first, config.json last (write-then-rename each), so a half-written folder never
    reads as a drafter."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "model.safetensors.tmp.safetensors"
    mx.save_safetensors(str(tmp), weights, metadata={"format": "pt"})
    tmp.replace(folder / "model.safetensors")
    for name, text in (
        (CARD, json.dumps(card, indent=2)),
        ("README.md", readme),
        ("config.json", json.dumps(cfg, indent=2)),
    ):
        part = folder / (name + ".tmp")
        part.write_text(text + "\n")
        part.replace(folder / name)


def readme(card: dict) -> str:
    t, m = card["target"], card.get("measured", {})
    lines = [
        "# EAGLE-3 drafter trained by `mlxcel draft train`",
        "",
        f"Target: `{t['name']}` (fingerprint `{t['fingerprint'][:16]}…`). It is refused for any other target.",
        "",
        f"Use: `mlxcel generate -m {t['name']} --draft-model THIS_FOLDER` (or chat, run, serve).",
        "",
        "Layout: vLLM speculators' EAGLE-3 (`Eagle3Speculator`; `d2t`/`t2d` map the draft vocabulary).",
        "",
        "| | |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v} |" for k, v in {**card["training"], **m}.items()]
    return "\n".join(lines)
