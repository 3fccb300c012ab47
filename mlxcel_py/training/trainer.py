"""The run of `mlxcel draft train`: record, choose the draft vocabulary, train, write.

Budget: `--minutes` covers the whole run (time spent before a `--resume` counts); recording
stops at `--tokens` answer tokens or at DATA_SHARE of it (passing over the prompts again,
sampled, while either is left), training takes the rest. Labels are the target's greedy picks
(recording.py). Held-out
prompts (corpus.HELD_OUT_SHARE, at most HELD_OUT_MAX) are recorded first and never trained on;
each evaluation reports step 1's top-1 agreement with the target and the mean number of a
round's drafts the target would accept (consecutive hits of the unrolled steps), which is what
speeds decoding. A checkpoint (`OUT/.train`: parameters, optimizer state, step, clock) and the
drafter itself are written every CHECKPOINT_S and at the end, so an interrupted run leaves a
drafter that loads and a state `--resume` continues; `--seed` repeats a run's data and order.

Shape (docs/drafter-training.md has the measurements): one layer of the target's width and
heads, the target's MLP width unless --intermediate-size, taps at vLLM's default depths, the
output layer over the answers' most used tokens. Every weight starts random: starting the output
layer from the target's own rows was measured worse (loss 20-75 after the same steps, 9.1 from
random), the drafter's last hidden state is not the target's.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_unflatten

from ..drafters import eagle3
from ..drafters.eagle3_net import Eagle3Net, Spec
from ..errors import MlxcelError, UsageError
from ..models.config import text_config
from ..models.fingerprint import fingerprint
from ..models.taps import lm_head_and_embed
from . import corpus, export, recording, samples, ttt, vocab
from .plan import DATA_SHARE, TrainPlan

CHECKPOINT_S = 120.0
EVAL_S = 60.0
HELD_OUT_MAX = 16
PROMPT_PASSES = 4  # at most: the recorded data stays in memory until training
WARMUP_STEPS = 50


@dataclass(frozen=True)
class Progress:
    phase: str  # "held-out" | "data" | "train" | "eval" | "saved"
    done: float
    total: float
    text: str = ""
    at: float = 0.0  # seconds of the run's budget spent (--resume counts earlier runs)


@dataclass
class Result:
    out: Path
    samples: int = 0
    answer_tokens: int = 0
    steps: int = 0
    seconds: float = 0.0
    held_out: dict = field(default_factory=dict)


class Clock:
    def __init__(self, spent: float):
        self.start = time.monotonic() - spent

    def __call__(self) -> float:
        return time.monotonic() - self.start


def make_spec(target_cfg: dict, plan: TrainPlan) -> Spec:
    t = text_config(target_cfg)
    H, heads = int(t["hidden_size"]), int(t["num_attention_heads"])
    return Spec(
        hidden_size=H,
        num_attention_heads=heads,
        num_key_value_heads=int(t.get("num_key_value_heads") or heads),
        head_dim=int(t.get("head_dim") or H // heads),
        intermediate_size=int(plan.intermediate_size or t["intermediate_size"]),
        vocab_size=int(t["vocab_size"]),
        draft_vocab_size=min(plan.draft_vocab, int(t["vocab_size"])),
        rms_norm_eps=float(t.get("rms_norm_eps", 1e-5)),
        aux_layer_ids=eagle3.default_aux_ids(int(t["num_hidden_layers"])),
        rope_theta=float(t.get("rope_theta", 10000.0)),
        rope_scaling=t.get("rope_scaling"),
        max_position_embeddings=int(t.get("max_position_embeddings", 8192)),
    )


def evaluate(net: Eagle3Net, embed: Any, held: list, lut: mx.array, width: int) -> dict:
    """Step-1 top-1 and mean accepted drafts a round (of `width`) over the held-out answers."""
    hits = count = 0
    chains: list[int] = []
    for s in held:
        x = mx.array([s.tokens], dtype=mx.int32)
        y = mx.array([s.labels], dtype=mx.int32)
        steps = ttt.unrolled(net, embed, s.features[None].astype(mx.float32), x, width, y)
        m = steps[-1][1].shape[1]  # indexes every step has
        good = []
        for logits, labels in steps:
            d = lut[labels[:, :m]]
            good.append(((mx.argmax(logits[:, :m], -1) == d) & (d >= 0))[0])
        ok = mx.stack(good).tolist()  # (steps, m)
        first_answer = max(0, s.prompt_len - 2)  # step 1 at j predicts position j + 2
        for j in range(first_answer, m):
            n = 0
            while n < len(ok) and ok[n][j]:
                n += 1
            chains.append(n)
        hits += sum(ok[0][first_answer:m])
        count += max(0, m - first_answer)
    return {
        "held_out_top1": round(hits / count, 4) if count else 0.0,
        "held_out_accepted_per_round": round(sum(chains) / len(chains), 3) if chains else 0.0,
    }


def run(plan: TrainPlan, report: Callable[[Progress], None], say: Callable[[str], None]) -> Result:
    from .. import api

    state_dir = plan.state_dir
    state = json.loads((state_dir / "state.json").read_text()) if plan.resume else {}
    clock = Clock(float(state.get("seconds", 0.0)))
    budget = plan.minutes * 60

    def tell(phase: str, done: float, total: float, text: str = "") -> None:
        report(Progress(phase, done, total, text, clock()))

    prompts = corpus.gather(list(plan.prompts), plan.seed, plan.builtin_prompts)  # bad files refused before loading
    model = api.load(plan.target, warmup=False)
    target = model.session.target
    resolved = target.resolved
    mark = fingerprint(resolved.path, resolved.gguf)
    if plan.resume and state.get("target_fingerprint") not in (None, mark):
        raise UsageError(f"--resume: {plan.out} was trained for another target ({state.get('target')}); name that -m")
    spec = make_spec(resolved.config, plan)
    taps = [j - 1 for j in spec.aux_layer_ids]
    eos = target.tokenizer.eos_token_ids

    def encode(text: str) -> list[int]:
        return model.encode(text, chat_template=plan.chat_template)

    state_dir.mkdir(parents=True, exist_ok=True)
    unfinished = state_dir / "UNFINISHED"  # until the budget is spent: `make drafter` resumes while it is there
    unfinished.write_text("")

    held = samples.load(state_dir / "held_out.safetensors")
    if not held and prompts.held_out:
        for i, s in enumerate(
            recording.record(
                model.model,
                encode,
                eos,
                prompts.held_out[:HELD_OUT_MAX],
                taps,
                max_tokens=plan.max_answer,
                batch=plan.batch,
                seed=plan.seed,
                first_index=10**6,
            ),
            1,
        ):
            held.append(s)
            tell("held-out", i, min(len(prompts.held_out), HELD_OUT_MAX))
        samples.save(state_dir / "held_out.safetensors", held)
    train = samples.load(state_dir / "samples.safetensors")
    if not train:
        data_end = DATA_SHARE * budget
        have = [0]  # answer tokens recorded (read by `stop` between steps)

        def enough() -> bool:
            return clock() >= data_end or have[0] >= plan.tokens

        # the prompts again while budget is left, every answer sampled (each pass its own seeds):
        # new contexts for the same greedy labels (recording is a few minutes of a run now)
        for rnd in range(PROMPT_PASSES):
            for s in recording.record(
                model.model, encode, eos, prompts.train, taps, max_tokens=plan.max_answer, batch=plan.batch,
                seed=plan.seed, stop=enough, first_index=rnd * 2 * 10**6, all_sampled=rnd > 0,
            ):  # fmt: skip
                train.append(s)
                have[0] += s.answer_len
                tell("data", min(have[0], plan.tokens), plan.tokens, f"{len(train)} answers")
            if enough():
                break
        if not train:
            raise MlxcelError("no answer was recorded within the budget; raise --minutes")
        samples.save(state_dir / "samples.safetensors", train)
    counts = vocab.count((s.labels, s.prompt_len) for s in train)
    draft_ids = state.get("draft_ids") or vocab.choose(counts, spec.draft_vocab_size, spec.vocab_size)
    answer_tokens = sum(s.answer_len for s in train)
    say(
        f"data: {len(train)} answers, {answer_tokens} answer tokens; draft vocabulary {len(draft_ids)} covers "
        f"{vocab.coverage(counts, draft_ids):.1%} of them; {len(held)} held-out answers"
    )

    _, embed = lm_head_and_embed(model.model)
    mx.random.seed(plan.seed)
    net = Eagle3Net(spec)
    ids = mx.array(draft_ids, dtype=mx.int32)
    net.d2t = ids - mx.arange(len(draft_ids), dtype=mx.int32)
    if plan.resume and (state_dir / "params.safetensors").is_file():
        net.load_weights(str(state_dir / "params.safetensors"), strict=False)
    net.freeze(keys=["d2t"])
    opt = optim.AdamW(learning_rate=plan.learning_rate, weight_decay=0.0)
    step = int(state.get("step", 0))
    if plan.resume and (state_dir / "optimizer.safetensors").is_file():
        opt.init(net.trainable_parameters())
        opt.state = tree_unflatten(list(mx.load(str(state_dir / "optimizer.safetensors")).items()))
    lut = mx.full((spec.vocab_size,), -1, dtype=mx.int32)
    lut[ids] = mx.arange(len(draft_ids), dtype=mx.int32)

    def loss_of(net, feats, x, y, prompt_len):
        return ttt.loss(net, embed, feats, x, prompt_len, lut, plan.width, y)[0]

    grad = nn.value_and_grad(net, loss_of)
    result = Result(out=plan.out, samples=len(train), answer_tokens=answer_tokens)
    card_base = {
        "target": {
            "name": plan.target or resolved.source.split(" (")[0],
            "path": str(resolved.path),
            "fingerprint": mark,
        },
        "training": {
            "kind": plan.kind,
            "answers": len(train),
            "answer_tokens": answer_tokens,
            "draft_vocab": len(draft_ids),
            "width": plan.width,
            "intermediate_size": spec.intermediate_size,
            "seed": plan.seed,
        },
    }

    def save(metrics: dict) -> None:
        mx.save_safetensors(
            str(state_dir / "params.safetensors"), {k: v for k, v in tree_flatten(net.parameters()) if k != "d2t"}
        )
        mx.save_safetensors(str(state_dir / "optimizer.safetensors"), dict(tree_flatten(opt.state)))
        meta = {
            "seconds": clock(),
            "step": step,
            "draft_ids": draft_ids,
            "target": card_base["target"]["name"],
            "target_fingerprint": mark,
            "metrics": metrics,
        }
        (state_dir / "state.json").write_text(json.dumps(meta))
        card = {**card_base, "training": {**card_base["training"], "steps": step, "seconds": round(clock())}}
        card["measured"] = metrics
        cfg = export.config(spec, resolved.config, card_base["target"]["name"], plan.width)
        export.write(plan.out, cfg, export.tensors(net, draft_ids, spec.vocab_size), card, export.readme(card))
        tell("saved", clock(), budget)

    metrics = dict(state.get("metrics") or {})
    last_save = last_eval = clock()
    epoch = step // max(1, len(train))
    base_lr = plan.learning_rate
    interrupted = True  # Ctrl-C: save at once, no held-out evaluation first
    try:
        while clock() < budget:
            order = list(range(len(train)))
            random.Random(plan.seed * 1_000 + epoch).shuffle(order)
            for i in order[step % len(train) :] if epoch == step // len(train) else order:
                if clock() >= budget:
                    break
                s = train[i]
                frac = min(1.0, clock() / budget)
                opt.learning_rate = base_lr * min(1.0, (step + 1) / WARMUP_STEPS) * (1.0 - 0.9 * frac)
                x = mx.array([s.tokens], dtype=mx.int32)
                y = mx.array([s.labels], dtype=mx.int32)
                loss, grads = grad(net, s.features[None].astype(mx.float32), x, y, s.prompt_len)
                opt.update(net, grads)
                mx.eval(net.parameters(), opt.state, loss)
                step += 1
                tell("train", clock(), budget, f"step {step} loss {loss.item():.3f}")
                if held and clock() - last_eval >= EVAL_S:
                    metrics = evaluate(net, embed, held, lut, plan.width)
                    tell("eval", clock(), budget, _metrics_text(metrics))
                    last_eval = clock()
                if clock() - last_save >= CHECKPOINT_S:
                    save(metrics)
                    last_save = clock()
            epoch += 1
        interrupted = False
    finally:
        if held and not interrupted:
            metrics = evaluate(net, embed, held, lut, plan.width)
        save(metrics)
    unfinished.unlink(missing_ok=True)
    result.steps, result.seconds, result.held_out = step, clock(), metrics
    return result


def _metrics_text(m: dict) -> str:
    return (
        f"held-out top-1 {m.get('held_out_top1', 0):.1%}, "
        f"{m.get('held_out_accepted_per_round', 0):.2f} drafts accepted a round"
    )
