"""What `mlxcel draft train` is asked for, checked before any model loads (no MLX here)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError

KINDS = ("eagle3", "dflash")
DEFAULT_MINUTES = 40.0
DEFAULT_TOKENS = 400_000
DEFAULT_DRAFT_VOCAB = 8192
DEFAULT_WIDTH = 2
DEFAULT_MAX_ANSWER = 256
DEFAULT_BATCH = 8
DATA_SHARE = 0.4  # at most this share of --minutes records answers; training gets the rest


@dataclass(frozen=True)
class TrainPlan:
    target: str | None
    out: Path
    kind: str = "eagle3"
    prompts: tuple[Path, ...] = ()
    builtin_prompts: bool = True
    chat_template: bool = True  # False: prompts go in as raw text (a base model's completions)
    tokens: int = DEFAULT_TOKENS
    minutes: float = DEFAULT_MINUTES
    resume: bool = False
    seed: int = 0
    draft_vocab: int = DEFAULT_DRAFT_VOCAB
    width: int = DEFAULT_WIDTH
    intermediate_size: int | None = None  # None: the target's
    max_answer: int = DEFAULT_MAX_ANSWER
    batch: int = DEFAULT_BATCH
    learning_rate: float = 1e-3

    @property
    def state_dir(self) -> Path:
        return self.out / ".train"


def check(plan: TrainPlan) -> TrainPlan:
    if plan.kind not in KINDS:
        raise UsageError(f"--kind {plan.kind}: choose one of {', '.join(KINDS)}")
    if plan.kind == "dflash":
        raise UsageError(
            "--kind dflash: training a DFlash drafter is not implemented yet; --kind eagle3 (the default) trains "
            "an EAGLE-3 drafter"
        )
    # Upper bounds catch a mistyped digit before it becomes hours of recording or an out-of-memory
    # batch: the recorded answers (with their tapped features) live in memory until training.
    for name, value, low, high, what in (
        ("--tokens", plan.tokens, 1, 100_000_000, "answer tokens"),
        ("--draft-vocab", plan.draft_vocab, 16, 1_000_000, "tokens"),
        ("--width", plan.width, 1, 16, "drafts a round"),
        ("--max-answer", plan.max_answer, 8, 8192, "tokens an answer"),
        ("--batch", plan.batch, 1, 64, "prompts at once"),
    ):
        if value < low:
            raise UsageError(f"{name} {value}: must be at least {low}")
        if value > high:
            raise UsageError(f"{name} {value}: at most {high:,} {what}")
    if not 0 < plan.minutes <= 7 * 24 * 60:
        raise UsageError(f"--minutes {plan.minutes:g}: must be above 0 and at most a week (10080)")
    if plan.intermediate_size is not None and not 1 <= plan.intermediate_size <= 65536:
        raise UsageError(f"--intermediate-size {plan.intermediate_size}: must be from 1 to 65536")
    if not 0 < plan.learning_rate <= 1:  # also refuses nan
        raise UsageError(f"--learning-rate {plan.learning_rate:g}: must be above 0 and at most 1")
    if not plan.prompts and not plan.builtin_prompts:
        raise UsageError("--no-builtin-prompts leaves nothing to train on; add --prompts FILE.jsonl")
    out = plan.out
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: is a file; name a folder")
    if out.is_dir() and any(out.iterdir()) and not plan.resume:
        raise UsageError(
            f"--out {out}: the folder is not empty; pass --resume to continue its training, or name another"
        )
    if plan.resume and not (plan.state_dir / "state.json").is_file():
        raise UsageError(f"--resume: {out} holds no training to resume (no .train/state.json); drop --resume")
    return plan
