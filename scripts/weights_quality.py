"""How close the row-exact kernel's weight modes stay to float32 on the public workload.

For each prompt, the float32 model decodes greedily (the reference continuation); then the
prompt + continuation is fed once (teacher forcing) to the float32 model and to each
--cpu-weights mode, and at every continuation position we compare the next-token distributions:
top-1 agreement and KL(float32 || mode) in nats. Usage:

    python scripts/weights_quality.py [--max-tokens 64] [--limit N] [--modes q8,q4,auto] [-m MODEL]

Prints one Markdown table (stdout) and writes --json if given. Blocks of up to 65 positions go
through the kernel; longer prompts are fed in chunks of 64 so every position is scored on the
kernel path as decoding would be.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlxcel_py.cpu import blas  # noqa: E402

blas.prepare()

import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

from mlxcel_py.cpu import kernels as cpu_kernels  # noqa: E402
from mlxcel_py.formats.prompting import prompt_ids  # noqa: E402
from mlxcel_py.models import loading


def logprobs_over(model, ids: list[int], start: int, chunk: int = 64) -> mx.array:
    """log-softmax rows predicting ids[start+1:], the whole sequence fed in chunks of `chunk`."""
    cache = make_prompt_cache(model)
    rows = []
    with cpu_kernels.engaged(model):
        for i in range(0, len(ids) - 1, chunk):
            part = ids[i : min(i + chunk, len(ids) - 1)]
            out = model(mx.array([part]), cache=cache)[0]
            rows.append(out)
            mx.eval(out)
    logits = mx.concatenate(rows)[start:]
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--workload", default=str(ROOT / "benchmarks" / "workloads.jsonl"))
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--modes", default="q8,q4,auto")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    resolved = loading.resolve(a.model)
    ref = loading.load(resolved, cpu_weights="f32")
    modes = {m: loading.load(resolved, cpu_weights=m) for m in a.modes.split(",")}
    items = [json.loads(line) for line in Path(a.workload).read_text().splitlines() if line.strip()][: a.limit]
    from mlxcel_py.engine.engine import Engine

    eng = Engine(
        ref.model, eos_ids=ref.tokenizer.eos_token_ids, vocab_size=ref.vocab_size, context_length=ref.context_length
    )
    stats = {m: {"positions": 0, "top1": 0, "kl": 0.0} for m in modes}
    for item in items:
        ids = prompt_ids(ref.tokenizer, item["prompt"])
        cont = [e.token for e in eng.generate(ids, max_tokens=a.max_tokens, remember=False)]
        if not cont:
            continue
        seq = ids + cont
        p = logprobs_over(ref.model, seq, len(ids) - 1)
        for m, lm in modes.items():
            q = logprobs_over(lm.model, seq, len(ids) - 1)
            kl = (mx.exp(p) * (p - q)).sum(axis=-1)
            st = stats[m]
            st["positions"] += p.shape[0]
            st["top1"] += int((p.argmax(-1) == q.argmax(-1)).sum().item())
            st["kl"] += kl.sum().item()
        print(f"{item.get('kind', '?')}: {len(cont)} positions", file=sys.stderr)
    lines = [
        "| --cpu-weights | weights | positions | top-1 agreement with f32 | mean KL(f32 ‖ mode), nats |",
        "|---|---|---|---|---|",
    ]
    for m, st in stats.items():
        n = max(st["positions"], 1)
        st["top1_agreement"], st["mean_kl"] = st["top1"] / n, st["kl"] / n
        lines.append(
            f"| {m} | {modes[m].dtype.split(' (')[0]} | {st['positions']} | {st['top1_agreement']:.4f} | "
            f"{st['mean_kl']:.2e} |"
        )
    print("\n".join(lines))
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {
                    "model": resolved.source,
                    "max_tokens": a.max_tokens,
                    "modes": {m: {**st, "weights": modes[m].dtype} for m, st in stats.items()},
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
