"""The benchmark runner behind `mlxcel bench`: plain vs each drafter and width, interleaved.

Engine-level (token ids, Engines, stats); no CLI, rich or plotting imports, and MLX only inside
`run`. For every prompt the
plain run comes first, then each speculative configuration, then the optional peer (stock mlx-lm
in a subprocess), so slow drift of a shared machine hits every column alike; with repeats, each
prompt's configurations run in turn that many times and the median-speed run of each is kept. Everything is
warmed before the first timed run. Per-prompt records are kept raw; `report.summarize` aggregates them
per (configuration, kind) the way the seed page's "Choosing a Proposal Width" asks: mean accepted
prefix and useful tokens per verify rather than acceptance alone, draft and verify time apart,
target-only latency and memory beside them. Ratios are medians of per-prompt ratios.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..drafters import registry
from ..formats.prompting import prompt_ids, render_messages
from ..options import DraftConfig, SamplingOptions
from .workload import Trace, WorkItem

ALL_KINDS = "all"


@dataclass
class RunRecord:
    """One timed generation of one prompt under one configuration."""

    prompt_index: int
    kind: str
    source: str
    config: str  # "plain", a registry.label, or a peer's "mlx-lm plain" / "mlx-lm draft k=N" / "llama.cpp lookup k=N"
    width: int | None
    tokens: int
    decode_tps: float
    decode_s: float
    prefill_s: float = 0.0
    peak_memory_mib: float = 0.0
    rounds: int = 0
    drafted_rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    identical: bool | None = None  # speculative tokens == the plain run's tokens
    speedup: float | None = None  # decode_tps / the plain run's decode_tps
    weights: str = ""  # --cpu-weights mode of the target that ran it ("" for peers and single-mode runs)


@dataclass
class BenchResult:
    records: list[RunRecord] = field(default_factory=list)
    configs: list[str] = field(default_factory=list)
    weights: list[str] = field(default_factory=lambda: [""])  # the targets' --cpu-weights modes, in run order


def _record(i: int, item: WorkItem, config: str, width: int | None, gen) -> RunRecord:
    st = gen.stats
    return RunRecord(
        prompt_index=i,
        kind=item.kind,
        source=item.source,
        config=config,
        width=width,
        tokens=st.generated_tokens,
        decode_tps=st.decode_tps,
        decode_s=st.decode_s,
        prefill_s=st.prefill_s,
        peak_memory_mib=st.peak_memory_bytes / 2**20,
        rounds=st.rounds,
        drafted_rounds=st.drafted_rounds,
        proposed=st.proposed,
        accepted=st.accepted,
        draft_s=st.draft_s,
        verify_s=st.verify_s,
    )


def _drain(gen) -> list[int]:
    for _ in gen:
        pass
    return list(gen.tokens)


def run(
    model: Any,
    tokenizer: Any,
    *,
    items: Sequence[WorkItem],
    drafts: Sequence[DraftConfig],
    max_tokens: int,
    sampling: SamplingOptions,
    vocab_size: int | None,
    context_length: int,
    drafters_for: Callable[[DraftConfig, Any], Any] | None = None,  # (config, target model) -> DrafterSource
    chat_template: bool = True,
    peer: Any = None,  # a peers.WorkerPeer (mlx-lm or llama.cpp) or None
    repeats: int = 1,  # timed runs per prompt and configuration; the median-speed run is kept
    traces: Sequence[Trace] | None = None,  # multi-turn traces instead of `items`
    on_step: Callable[[str], None] = lambda s: None,
    weights: Sequence[tuple[str, Any]] = (),  # (mode, model) per --cpu-weights mode, `model` first; () = one target
) -> BenchResult:
    """Time every prompt plainly, under every draft configuration, and on the peer; with several
    weight modes, each mode's plain and speculative runs, interleaved prompt by prompt."""
    from ..engine.engine import Engine  # here, not at the top: summaries and plots stay importable without MLX

    eos = tokenizer.eos_token_ids
    targets = list(weights) or [("", model)]

    def engines_for(m: Any) -> tuple[Any, list[Any]]:
        plain = Engine(m, eos_ids=eos, vocab_size=vocab_size, context_length=context_length)
        return plain, [
            Engine(m, eos_ids=eos, vocab_size=vocab_size, context_length=context_length, drafters=drafters_for(d, m))
            for d in drafts
        ]

    sets = [(mode, *engines_for(m)) for mode, m in targets]  # (mode, plain engine, draft engines)
    labels = [registry.label(d) for d in drafts]
    if traces:
        first = render_messages(
            tokenizer, [{"role": "user", "content": traces[0].turns[0]}], chat_template=chat_template
        )
    else:
        prompts = [prompt_ids(tokenizer, it.prompt, chat_template=chat_template) for it in items]
        first = prompts[0]

    on_step("warmup")
    for _, plain, engines in sets:
        plain.warmup(sampling=sampling)
        for eng, d in zip(engines, drafts):
            eng.warmup(sampling=sampling, calibrate=registry.calibrates(d))
        for eng in [plain, *engines]:  # one short untimed request each: first-call costs stay out
            _drain(eng.generate(first, max_tokens=min(8, max_tokens), sampling=sampling, remember=False))
    if peer is not None:
        peer.warmup(first, min(8, max_tokens))

    result = BenchResult(configs=["plain", *labels], weights=[mode for mode, _ in targets])

    def bench_one(i: int, item: WorkItem, ids: list[int]) -> list[int]:
        """Every configuration on one prompt (repeats interleaved); returns the first mode's plain tokens."""
        runs: dict[tuple[str, str], list[RunRecord]] = {}
        base_tokens: dict[str, list[int]] = {}
        for rep in range(repeats):  # repeats interleave too: plain, spec..., plain, spec...
            tag = f" ({rep + 1}/{repeats})" if repeats > 1 else ""
            for mode, plain, engines in sets:
                at = f" [{mode}]" if mode else ""
                on_step(f"{item.kind} #{i + 1} plain{at}{tag}")
                g = plain.generate(ids, max_tokens=max_tokens, sampling=sampling, remember=False)
                toks = _drain(g)
                base_tokens.setdefault(mode, toks)
                rec = _record(i, item, "plain", None, g)
                rec.weights = mode
                runs.setdefault((mode, "plain"), []).append(rec)
                for eng, d, label in zip(engines, drafts, labels):
                    on_step(f"{item.kind} #{i + 1} {label}{at}{tag}")
                    # a drafter with memory learns each prompt once, after all its repeats: a repeat
                    # must not draft from its own earlier output
                    g = eng.generate(ids, max_tokens=max_tokens, sampling=sampling, remember=False)
                    same = _drain(g) == base_tokens[mode]
                    rec = _record(i, item, label, registry.width(d), g)
                    rec.identical, rec.weights = same, mode
                    runs.setdefault((mode, label), []).append(rec)
            if peer is not None:
                for label, width in peer.configs():
                    on_step(f"{item.kind} #{i + 1} {label}{tag}")
                    out = peer.generate(ids, max_tokens, width)
                    runs.setdefault(("", label), []).append(
                        RunRecord(
                            prompt_index=i,
                            kind=item.kind,
                            source=item.source,
                            config=label,
                            width=width,
                            tokens=out.tokens,
                            decode_tps=out.tps,
                            decode_s=out.tokens / out.tps if out.tps else 0.0,
                            prefill_s=out.prefill_s,
                            peak_memory_mib=out.peak_mib,
                        )
                    )
        for mode, _, engines in sets:
            for eng in engines:
                eng.remember(list(ids) + base_tokens[mode])
        bases = {mode: _median_run(runs[(mode, "plain")]) for mode, *_ in sets}
        result.records.extend(bases.values())
        for (mode, label), recs in runs.items():
            if label == "plain":
                continue
            rec = _median_run(recs)
            if rec.identical is not None:
                base = bases[mode]
                rec.identical = all(r.identical for r in recs)
                rec.speedup = rec.decode_tps / base.decode_tps if base.decode_tps else 0.0
            result.records.append(rec)
        return base_tokens[sets[0][0]]

    if traces:  # each turn's prompt is the conversation so far, replies being plain decoding's
        i = 0
        for trace in traces:
            history: list[dict] = []
            for k, turn in enumerate(trace.turns):
                history.append({"role": "user", "content": turn})
                ids = render_messages(tokenizer, history, chat_template=chat_template)
                toks = bench_one(i, WorkItem(kind=f"turn {k + 1}", prompt=turn, source=trace.source), ids)
                history.append({"role": "assistant", "content": tokenizer.decode(toks)})
                i += 1
    else:
        for i, (item, ids) in enumerate(zip(items, prompts)):
            bench_one(i, item, ids)
    for label in peer.configs() if peer is not None else []:
        result.configs.append(label[0])
    return result


def _median_run(recs: Sequence[RunRecord]) -> RunRecord:
    """The repeat with the median decode speed (the lower middle one for an even count)."""
    ranked = sorted(recs, key=lambda r: r.decode_tps)
    return ranked[(len(ranked) - 1) // 2]
