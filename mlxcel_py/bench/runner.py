"""The benchmark runner behind `mlxcel bench`: plain vs each drafter and width, interleaved.

Engine-level (token ids, Engines, stats); no CLI, rich or plotting imports, and MLX only inside
`run`. For every prompt the
plain run comes first, then each speculative configuration, then the optional peer (stock mlx-lm
in a subprocess), so slow drift of a shared machine hits every column alike; with repeats, each
prompt's configurations run in turn that many times and the median-speed run of each is kept. Everything is
warmed before the first timed run. Per-prompt records are kept raw; `summarize` aggregates them
per (configuration, kind) the way the seed page's "Choosing a Proposal Width" asks: mean accepted
prefix and useful tokens per verify rather than acceptance alone, draft and verify time apart,
target-only latency and memory beside them. Ratios are medians of per-prompt ratios.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..drafters import registry
from ..engine.prompting import prompt_ids, render_messages
from ..options import PEERS, DraftConfig, SamplingOptions
from .workload import Trace, WorkItem

ALL_KINDS = "all"
WIDTH_TIE = 0.02  # widths within 2% of the best median speedup count as tied: pick the narrowest


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
class SummaryRow:
    config: str
    width: int | None
    kind: str
    prompts: int
    plain_tps: float
    spec_tps: float
    speedup: float  # median of per-prompt ratios
    mean_accepted_prefix: float
    tokens_per_verify: float  # useful tokens per verify forward: accepted + the target's own token
    acceptance_rate: float
    draft_ms_per_round: float
    verify_ms_per_round: float
    plain_ms_per_token: float
    plain_peak_mib: float
    spec_peak_mib: float
    identical: int
    peer_tps: float | None = None  # the peer on the same prompts (plain, or its speculation of the same kind)
    vs_peer: float | None = None  # median of per-prompt spec_tps / peer_tps
    weights: str = ""  # --cpu-weights mode (bench --cpu-weights A,B,...)
    plain_vs_first: float | None = None  # median of per-prompt plain tps / the first mode's plain tps


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


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _is_peer(config: str) -> bool:
    return config.split(" ", 1)[0] in PEERS


def _peer_for(config: str, width: int | None, records: Sequence[RunRecord]) -> list[RunRecord]:
    """The peer runs to compare a configuration with: the peer's own speculation of the same kind at
    the same width (mlx-lm's draft path for a full-model drafter, llama.cpp's prompt lookup for
    prompt lookup), else the peer's plain decoding."""
    same = {"full-model": f"mlx-lm draft k={width}", "prompt-lookup": f"llama.cpp lookup k={width}"}
    for prefix, label in same.items():
        if config.startswith(prefix):
            runs = [r for r in records if r.config == label]
            if runs:
                return runs
    return [r for r in records if _is_peer(r.config) and r.config.endswith(" plain")]


def summarize(result: BenchResult) -> list[SummaryRow]:
    """One row per speculative configuration and kind, plus an `all` row per configuration."""
    recs = result.records
    plain_by_prompt = {(r.weights, r.prompt_index): r for r in recs if r.config == "plain"}
    first = result.weights[0]
    kinds = sorted({r.kind for r in recs})
    rows = []
    for mode, config in ((m, c) for m in result.weights for c in result.configs):
        if config == "plain" or _is_peer(config):
            continue
        mine = [r for r in recs if r.config == config and r.weights == mode]
        peer_all = _peer_for(config, mine[0].width if mine else None, recs)
        for kind in kinds + [ALL_KINDS]:
            sel = [r for r in mine if kind in (ALL_KINDS, r.kind)]
            if not sel:
                continue
            base = [plain_by_prompt[(mode, r.prompt_index)] for r in sel]
            firsts = [(b, plain_by_prompt.get((first, b.prompt_index))) for b in base]
            vs_first = [b.decode_tps / f.decode_tps for b, f in firsts if f is not None and f.decode_tps > 0]
            drafted = sum(r.drafted_rounds for r in sel)
            accepted = sum(r.accepted for r in sel)
            proposed = sum(r.proposed for r in sel)
            peer = {r.prompt_index: r for r in peer_all if kind in (ALL_KINDS, r.kind)}
            vs_peer = [
                r.decode_tps / peer[r.prompt_index].decode_tps
                for r in sel
                if r.prompt_index in peer and peer[r.prompt_index].decode_tps > 0
            ]
            plain_tokens = sum(b.tokens for b in base)
            rows.append(
                SummaryRow(
                    config=config,
                    width=sel[0].width,
                    kind=kind,
                    prompts=len(sel),
                    plain_tps=_median([b.decode_tps for b in base]),
                    spec_tps=_median([r.decode_tps for r in sel]),
                    speedup=_median([r.speedup or 0.0 for r in sel]),
                    mean_accepted_prefix=accepted / drafted if drafted else 0.0,
                    tokens_per_verify=(accepted + drafted) / drafted if drafted else 0.0,
                    acceptance_rate=accepted / proposed if proposed else 0.0,
                    draft_ms_per_round=1000 * sum(r.draft_s for r in sel) / drafted if drafted else 0.0,
                    verify_ms_per_round=1000 * sum(r.verify_s for r in sel) / drafted if drafted else 0.0,
                    plain_ms_per_token=1000 * sum(b.decode_s for b in base) / plain_tokens if plain_tokens else 0.0,
                    plain_peak_mib=max(b.peak_memory_mib for b in base),
                    spec_peak_mib=max(r.peak_memory_mib for r in sel),
                    identical=sum(bool(r.identical) for r in sel),
                    peer_tps=_median([r.decode_tps for r in peer.values()]) if peer else None,
                    vs_peer=_median(vs_peer) if vs_peer else None,
                    weights=mode,
                    plain_vs_first=_median(vs_first) if mode and vs_first else None,
                )
            )
    return rows


def plain_vs_peer(result: BenchResult) -> float | None:
    """Median over prompts of our plain decode tok/s over the peer's plain decode tok/s."""
    return _vs_peer(result, lambda ours, peer: ours.decode_tps / peer.decode_tps if peer.decode_tps > 0 else None)


def prefill_vs_peer(result: BenchResult) -> float | None:
    """Median over prompts of the peer's prefill time over ours (above 1: ours is faster), where
    the peer measures it (llama.cpp: its call's start to the first token)."""
    return _vs_peer(
        result, lambda ours, peer: peer.prefill_s / ours.prefill_s if min(peer.prefill_s, ours.prefill_s) > 0 else None
    )


def _vs_peer(result: BenchResult, ratio) -> float | None:
    peer = {r.prompt_index: r for r in result.records if _is_peer(r.config) and r.config.endswith(" plain")}
    got = [
        ratio(r, peer[r.prompt_index])
        for r in result.records
        if r.config == "plain" and r.weights == result.weights[0] and r.prompt_index in peer
    ]
    got = [g for g in got if g is not None]
    return _median(got) if got else None


@dataclass(frozen=True)
class WidthChoice:
    drafter: str  # "prompt-lookup" | "full-model" | "mtp" | "dflash" | "eagle3" | "suffix"
    width: int  # the flag's value
    speedup: float
    flag: str  # the flag that sets it


def recommend_widths(rows: Sequence[SummaryRow]) -> list[WidthChoice]:
    """Per drafter, the width with the best median speedup over all prompts; widths within
    WIDTH_TIE of the best count as tied and the narrowest wins (less verify work and memory:
    the seed page's 'stop increasing width when verification grows faster than useful work')."""
    out = []
    for drafter, flag in (
        ("prompt-lookup", "--prompt-lookup-max-draft"),
        ("full-model", "--draft-block-size"),
        ("mtp", "--draft-block-size"),
        ("dflash", "--draft-block-size"),
        ("eagle3", "--draft-block-size"),
        ("suffix", "--draft-block-size"),
    ):
        cands = [r for r in rows if r.kind == ALL_KINDS and r.config.startswith(drafter) and r.width]
        if not cands:
            continue
        best = max(r.speedup for r in cands)
        pick = min((r for r in cands if r.speedup >= best * (1 - WIDTH_TIE)), key=lambda r: r.width)
        # a DFlash block is its drafts plus the last committed token
        value = pick.width + 1 if registry.kind_of(drafter).anchored else pick.width
        out.append(WidthChoice(drafter, value, pick.speedup, flag))
    return out


def to_json(result: BenchResult, rows: Sequence[SummaryRow], choices: Sequence[WidthChoice], **meta: Any) -> dict:
    return {
        **meta,
        "plain_vs_peer": plain_vs_peer(result),
        "prefill_vs_peer": prefill_vs_peer(result),
        "configs": list(result.configs),
        "cpu_weights": list(result.weights) if result.weights != [""] else None,
        "summary": [asdict(r) for r in rows],
        "recommended_widths": [asdict(c) for c in choices],
        "runs": [asdict(r) for r in result.records],
    }
