"""`mlxcel draft train`: train a learned drafter for a model on this machine (training/ does the work)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..terminal import ui
from ..training import plan as P

app = typer.Typer(
    name="draft",
    help="Learned drafters: `mlxcel draft train` makes one for any model, on this machine.",
    no_args_is_help=True,
)

TRAIN_EPILOG = (
    "Examples:\n\n"
    "  mlxcel draft train --out drafters/smollm2\n\n"
    "  mlxcel draft train -m ./Qwen3-0.6B --out q3-eagle --prompts chats.jsonl --minutes 90\n\n"
    "  mlxcel draft train --out drafters/smollm2 --resume --minutes 60\n\n"
    "  mlxcel generate --draft-model drafters/smollm2 -p 'Write about the sea.'"
)


@app.command("train", epilog=TRAIN_EPILOG)
def train(
    out: Annotated[
        Path,
        typer.Option(
            "--out", "-o", help="Folder the drafter is written to (new or empty; with --resume, the run to continue)."
        ),
    ],
    model: Annotated[
        Optional[str],
        typer.Option(
            "--model",
            "-m",
            help="Target model the drafter serves (folder, .gguf or owner/name). Default: the embedded SmolLM2-135M-Instruct.",
        ),
    ] = None,
    kind: Annotated[
        str,
        typer.Option(
            "--kind",
            help="Drafter kind: eagle3 (one layer reading three of the target's hidden states; vLLM speculators layout).",
        ),
    ] = "eagle3",
    prompts: Annotated[
        Optional[list[Path]],
        typer.Option(
            "--prompts",
            help='JSONL of prompts the target answers for training data (repeatable): {"prompt": ...}, {"text": ...} or {"messages": [...]} a line.',
        ),
    ] = None,
    no_builtin: Annotated[
        bool, typer.Option("--no-builtin-prompts", help="Train only on --prompts, not the built-in prose prompts.")
    ] = False,
    no_chat_template: Annotated[
        bool,
        typer.Option(
            "--no-chat-template",
            help="Feed the prompts as raw text (a base model's completions) instead of through the chat template.",
        ),
    ] = False,
    tokens: Annotated[
        int, typer.Option("--tokens", metavar="N", help="Answer tokens to record (training data), at most.")
    ] = P.DEFAULT_TOKENS,
    minutes: Annotated[
        float,
        typer.Option(
            "--minutes",
            metavar="M",
            help=f"Wall-time budget of the whole run; recording gets at most {P.DATA_SHARE:.0%} of it.",
        ),
    ] = P.DEFAULT_MINUTES,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the training in --out (its data, weights, optimizer and clock).")
    ] = False,
    seed: Annotated[
        int,
        typer.Option(
            "--seed", "-s", help="Seed of the prompts' order, sampling and weights: the same seed repeats a run."
        ),
    ] = 0,
    draft_vocab: Annotated[
        int,
        typer.Option(
            "--draft-vocab", metavar="N", help="Draft vocabulary: the N tokens the answers use most (d2t/t2d)."
        ),
    ] = P.DEFAULT_DRAFT_VOCAB,
    width: Annotated[
        int,
        typer.Option(
            "--width", metavar="N", help="Drafts a round the training-time test unrolls (match --draft-block-size)."
        ),
    ] = P.DEFAULT_WIDTH,
    intermediate_size: Annotated[
        Optional[int],
        typer.Option("--intermediate-size", metavar="N", help="The drafter layer's MLP width (default: the target's)."),
    ] = None,
    max_answer: Annotated[
        int, typer.Option("--max-answer", metavar="N", help="Longest answer recorded per prompt, in tokens.")
    ] = P.DEFAULT_MAX_ANSWER,
    batch: Annotated[
        int, typer.Option("--batch", metavar="N", help="Prompts the target answers at once while recording.")
    ] = P.DEFAULT_BATCH,
    learning_rate: Annotated[
        float, typer.Option("--learning-rate", metavar="FLOAT", help="AdamW's peak learning rate.")
    ] = 1e-3,
) -> None:
    """Train a learned drafter (EAGLE-3) for a model: the model answers prompts, the drafter learns its hidden states."""
    from ..cpu import blas

    with ui.exit_on_error():
        plan = P.check(
            P.TrainPlan(
                target=model,
                out=out,
                kind=kind,
                prompts=tuple(prompts or ()),
                builtin_prompts=not no_builtin,
                chat_template=not no_chat_template,
                tokens=tokens,
                minutes=minutes,
                resume=resume,
                seed=seed,
                draft_vocab=draft_vocab,
                width=width,
                intermediate_size=intermediate_size,
                max_answer=max_answer,
                batch=batch,
                learning_rate=learning_rate,
            )
        )
        blas.prepare()  # before mlx.core (cpu/blas.py says why): training is matmul-bound
        from ..training import trainer

        with ui.timed_progress(plan.minutes * 60, "training") as update:
            last = {"text": ""}

            def report(p: trainer.Progress) -> None:
                if p.phase in ("held-out", "data"):
                    what = "held-out answers" if p.phase == "held-out" else "answer tokens"
                    update(f"recording {what}: {p.done:,.0f}/{p.total:,.0f}", p.at)
                    return
                if p.phase == "eval":
                    last["text"] = p.text
                    ui.info(f"eval: {p.text}")
                update(f"{p.text if p.phase == 'train' else 'checkpoint saved'}  {last['text']}", p.at)

            result = trainer.run(plan, report, ui.info)
    held = result.held_out
    ui.info(
        f"trained {result.steps} steps on {result.samples} answers ({result.answer_tokens} tokens) in "
        f"{result.seconds / 60:.1f} min; held-out: top-1 {held.get('held_out_top1', 0):.1%}, "
        f"{held.get('held_out_accepted_per_round', 0):.2f} drafts accepted a round"
    )
    ui.write_out(f"{plan.out}\n")
