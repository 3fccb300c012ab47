"""What `mlxcel bench` reports of a run (pure: no MLX, rich or plotting): per (configuration,
kind) summaries the way the seed page's "Choosing a Proposal Width" asks (mean accepted prefix and
useful tokens per verify rather than acceptance alone, draft and verify time apart, target-only
latency and memory beside them; ratios are medians of per-prompt ratios), the width each kind
should use, the peers' ratios, the JSON, and the markdown table.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..drafters import registry
from ..options import PEERS
from .runner import ALL_KINDS, BenchResult, RunRecord

WIDTH_TIE = 0.02  # widths within 2% of the best median speedup count as tied: pick the narrowest


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
    drafter: str  # a drafter kind (drafters/registry.py)
    width: int  # the flag's value
    speedup: float
    flag: str  # the flag that sets it


def recommend_widths(rows: Sequence[SummaryRow]) -> list[WidthChoice]:
    """Per drafter, the width with the best median speedup over all prompts; widths within
    WIDTH_TIE of the best count as tied and the narrowest wins (less verify work and memory:
    the seed page's 'stop increasing width when verification grows faster than useful work')."""
    out = []
    order = ("prompt-lookup", *(k for k in registry.KINDS if k != "prompt-lookup"))  # lookup first, then the table
    for drafter, flag in ((k, registry.KINDS[k].width_flag) for k in order):
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


def _fmt(x: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "–" if x is None else f"{x:{spec}}{suffix}"


def columns(rows: Sequence[SummaryRow], peer_name: str | None = "mlx-lm") -> tuple[list[str], list[list[str]]]:
    peer = any(r.peer_tps is not None for r in rows)
    modes = [r.weights for r in rows if r.weights]
    first = modes[0] if modes else None
    headers = (["weights"] if modes else []) + [
        "drafter",
        "kind",
        "prompts",
        "plain tok/s",
        "spec tok/s",
        "speedup",
        "mean accepted prefix",
        "tokens/verify",
        "acceptance",
        "draft ms/round",
        "verify ms/round",
        "identical",
    ]
    if peer:
        headers += [f"{peer_name} tok/s", f"vs {peer_name}"]
    if modes:
        headers += [f"plain vs {first}"]
    body = []
    for r in rows:
        line = ([r.weights] if modes else []) + [
            r.config,
            r.kind,
            str(r.prompts),
            _fmt(r.plain_tps),
            _fmt(r.spec_tps),
            _fmt(r.speedup, ".2f", "x"),
            _fmt(r.mean_accepted_prefix, ".2f"),
            _fmt(r.tokens_per_verify, ".2f"),
            _fmt(r.acceptance_rate * 100, ".0f", "%"),
            _fmt(r.draft_ms_per_round, ".2f"),
            _fmt(r.verify_ms_per_round, ".1f"),
            f"{r.identical}/{r.prompts}",
        ]
        if peer:
            line += [_fmt(r.peer_tps), _fmt(r.vs_peer, ".2f", "x")]
        if modes:
            line += [_fmt(r.plain_vs_first, ".2f", "x")]
        body.append(line)
    return headers, body


def markdown(rows: Sequence[SummaryRow], peer_name: str | None = "mlx-lm") -> str:
    headers, body = columns(rows, peer_name)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines) + "\n"
