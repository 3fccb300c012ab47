"""What a DFlash round costs on the default model's shape, against a plain decode step.

    python scripts/dflash_cost.py [--layers 1,2,5] [--block 16] [--rounds 30] [--json out.json]

The default model (SmolLM2-135M-Instruct, Q4_1 GGUF: hidden 576, 30 layers, vocabulary 49,152) is
the target; a DFlash drafter of its shape (hidden 576, 9 heads of 64, MLP 1536, tapping
`--layers`-many evenly spread target layers) is written with random weights, because this machine
cannot fetch a trained checkpoint: acceptance needs one, so this measures cost only. Timed per
round, each the median of `--rounds`, interleaved: a plain step (one token through the target),
the drafter's proposal (the block's one forward plus the new context rows), and the target's
verify of the whole block. Break-even acceptance follows: a round emits accepted + 1 tokens for
draft + verify, so it pays when accepted + 1 > (draft + verify) / step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mlxcel_py.cpu import blas

blas.prepare()

import mlx.core as mx  # noqa: E402

PROMPT = "Write a short story about a robot learning to paint, in three paragraphs."


def drafter_folder(root: Path, target_cfg: dict, layers: int, block: int) -> Path:
    from mlx.utils import tree_flatten

    from mlxcel_py.drafters.dflash import default_layer_ids, read_spec
    from mlxcel_py.drafters.dflash_net import DFlashNet

    n = target_cfg["num_hidden_layers"]
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": target_cfg["hidden_size"],
        "num_hidden_layers": layers,
        "num_attention_heads": target_cfg["num_attention_heads"],
        "num_key_value_heads": target_cfg["num_key_value_heads"],
        "head_dim": target_cfg["hidden_size"] // target_cfg["num_attention_heads"],
        "intermediate_size": target_cfg["intermediate_size"],
        "vocab_size": target_cfg["vocab_size"],
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "max_position_embeddings": 8192,
        "num_target_layers": n,
        "block_size": block,
        "dflash_config": {"mask_token_id": 0, "target_layer_ids": list(default_layer_ids(n, layers))},
    }
    folder = root / f"dflash-{layers}"
    folder.mkdir(parents=True)
    mx.random.seed(layers)
    net = DFlashNet(read_spec(cfg, folder, n))
    params = {k: (v * 0.05 if v.ndim >= 2 else v) for k, v in tree_flatten(net.parameters())}
    mx.save_safetensors(str(folder / "model.safetensors"), params)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="1,2,5")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    from mlxcel_py.commands._options import build_options
    from mlxcel_py.engine.cache import SequenceCache
    from mlxcel_py.engine.sampling import Decider
    from mlxcel_py.models import loading
    from mlxcel_py.models.config import text_config
    from mlxcel_py.options import SamplingOptions
    from mlxcel_py.session import open_session
    from mlxcel_py.validate import validate

    target = loading.resolve(None)
    tcfg = text_config(target.config)
    root = Path(tempfile.mkdtemp(prefix="dflash-cost-"))
    out: dict = {"target": target.source, "block": a.block, "rounds": a.rounds, "drafters": []}
    for layers in [int(x) for x in a.layers.split(",")]:
        folder = drafter_folder(root, tcfg, layers, a.block)
        s = open_session(validate(build_options("generate", {"prompt": "x", "draft_model": str(folder)})))
        ids = s.tokenizer.encode(PROMPT)
        eng = s.engine
        drafter = eng.drafters.new_drafter()
        k = eng.drafters.width
        decider = Decider(SamplingOptions(), prompt_len=len(ids), vocab_size=eng.vocab_size)
        cache = SequenceCache(eng.model)
        cache.keep_hidden(drafter.hidden_tap)
        cache.prefill(ids[:-1])
        history = list(ids)
        drafter.begin(history, cache)
        steps, drafts, verifies = [], [], []
        for r in range(a.rounds + 3):
            t0 = time.perf_counter()
            proposal = drafter.propose(history, k, decider)
            t1 = time.perf_counter()
            cache.mark()
            logits = cache.feed([history[-1], *proposal.tokens])
            mx.eval(logits)
            t2 = time.perf_counter()
            cache.truncate(len(history))  # as if no draft was accepted: the round's first input stays
            cache.release()
            history.append(int(mx.argmax(logits[0]).item()))
            t3 = time.perf_counter()
            mx.eval(cache.feed(history[-1:]))  # a plain step from the same place, then undone
            t4 = time.perf_counter()
            cache.truncate(len(history) - 1)
            if r >= 3:  # the first rounds trace shapes
                drafts.append(t1 - t0)
                verifies.append(t2 - t1)
                steps.append(t4 - t3)
        step, draft, verify = (statistics.median(x) for x in (steps, drafts, verifies))
        row = {
            "layers": layers,
            "taps": len(drafter.net.spec.target_layer_ids),
            "drafts_per_round": k,
            "step_ms": step * 1e3,
            "draft_ms": draft * 1e3,
            "verify_ms": verify * 1e3,
            "draft_vs_step": draft / step,
            "round_vs_step": (draft + verify) / step,
            "break_even_accepted": max(0.0, (draft + verify) / step - 1),
        }
        out["drafters"].append(row)
        print(
            f"{layers} layer(s): draft {row['draft_vs_step']:.2f}x a plain step, round (draft + verify of "
            f"{k + 1}) {row['round_vs_step']:.2f}x; pays off above {row['break_even_accepted']:.2f} accepted "
            f"drafts a round",
            file=sys.stderr,
        )
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
