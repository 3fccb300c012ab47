"""`mlxcel bench` after validation: load once, run the interleaved benchmark, report it.

Reports go to stderr (rich table, recommendation, plot path); `--markdown` puts the summary
table on stdout; `--json` writes every run plus the summary.
"""

from __future__ import annotations

import json
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ..drafters import composite, registry
from ..errors import MlxcelError
from ..options import BenchPlan, DraftConfig
from ..session import open_session
from ..terminal import ui
from . import report
from . import runner as benchmark
from .busy import busy_loops
from .report import WidthChoice, columns, markdown
from .runner import ALL_KINDS
from .workload import Trace, WorkItem

DEFAULT_PLOT = "mlxcel-bench-widths.png"


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("mlx", "mlx-lm", "mlxcel-py", "llama-cpp-python"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "unknown"
    return out


def _as_loaded(d: DraftConfig, loaded: DraftConfig, *, sweeping: bool) -> DraftConfig:
    """A planned model drafter as the session resolved it: an MTP, DFlash or EAGLE-3 checkpoint
    given as --draft-model runs as its kind, at its declared width unless a width was asked for (a swept
    width is the tokens proposed a round, so a DFlash block is one wider)."""
    if not d.enabled or not registry.kind_of(d.kind).loads_weights or not registry.kind_of(loaded.kind).detected:
        return d
    if sweeping:
        anchored = registry.kind_of(loaded.kind).anchored and not registry.kind_of(d.kind).anchored
        return replace(d, kind=loaded.kind, block_size=d.block_size + 1 if anchored else d.block_size)
    return replace(d, kind=loaded.kind, block_size=d.block_size if d.block_explicit else loaded.block_size)


def run_bench(plan: BenchPlan, items: Sequence[WorkItem], traces: Sequence[Trace] | None = None) -> None:
    opts = plan.run.options
    g = opts.generation
    b = plan.bench
    session = open_session(plan.run, say=ui.info, warn=ui.warn)
    target = session.target
    drafts = [_as_loaded(d, session.engine.draft, sweeping=bool(plan.widths)) for d in plan.drafts]
    peer = None
    if b.vs == "mlx-lm":
        from .peers import MlxLmPeer

        # mlx-lm's own speculative path takes a full draft model only
        widths = [d.block_size for d in plan.drafts if d.kind == "full-model" and not d.lookup_first]
        loaded_draft = getattr(session.drafters, "loaded", None)  # drafters.full_model.Source's
        ui.info("starting stock mlx-lm (its own process, bundled BLAS, weights as stored)")
        peer = MlxLmPeer(
            target.resolved.path,
            draft_path=loaded_draft.resolved.path if loaded_draft else None,
            draft_widths=widths,
            sampling=opts.sampling,
        )
    elif b.vs == "llama.cpp":
        from .peers import LlamaCppPeer

        if target.resolved.gguf is None:  # validation checked -m; a config file can still name a folder
            raise MlxcelError("--vs llama.cpp runs llama.cpp on the same GGUF file, and this model is not one")
        lookups = [d for d in plan.drafts if d.kind == "prompt-lookup"]
        widths = sorted({d.lookup.max_draft for d in lookups})
        ngram = lookups[0].lookup.ngram_max if lookups else 3
        ui.info(f"starting llama.cpp (llama-cpp-python, its own process) on {target.resolved.gguf.name}")
        peer = LlamaCppPeer(target.resolved.gguf, lookup_widths=widths, ngram_max=ngram, sampling=opts.sampling)
    loaded_by_mode = {plan.weights[0]: target}
    if len(plan.weights) > 1:  # bench --cpu-weights A,B,...: the same model again in each other form
        from ..models import loading

        mopts = opts.model
        for mode in plan.weights[1:]:
            loaded_by_mode[mode] = loading.load(
                target.resolved,
                dequantize=mopts.dequantize,
                fast_kernels=mopts.fast_kernels,
                cpu_weights=mode,
                cache_types=mopts.cache_types,
            )
            ui.info(f"--cpu-weights {mode}: weights {loaded_by_mode[mode].dtype}")
    weights = [(mode, m.model) for mode, m in loaded_by_mode.items()] if len(loaded_by_mode) > 1 else []
    loaded_of = {id(m.model): m for m in loaded_by_mode.values()}

    def drafters_for(d: DraftConfig, model) -> Any:
        """The session's loaded drafter (its draft model or head) at this configuration and target,
        or a new source for a kind that loads nothing (each configuration with its own memory)."""
        loaded = loaded_of[id(model)]
        own = session.drafters
        if own is not None and own.kind == d.kind and registry.kind_of(d.kind).loads_weights:
            source = own.retarget(d, loaded)
            return composite.Source(source) if d.lookup_first else source
        return registry.kind_of(d.kind).runtime().Source.of(d, loaded)

    per_prompt = (len(weights) or 1) * (1 + len(drafts)) * b.repeats + (len(peer.configs()) if peer else 0) * b.repeats
    n_prompts = sum(len(t.turns) for t in traces) if traces else len(items)
    ui.info(
        f"benchmark: {n_prompts} prompts{f' in {len(traces)} traces' if traces else ''} x {per_prompt} runs, max {g.max_tokens} tokens, "
        f"{'greedy' if opts.sampling.greedy else f'temp {opts.sampling.temp}'}; interleaved after warmup"
        + (f"; {b.busy} busy loop(s) at nice 19 beside it" if b.busy else "")
    )
    try:
        with busy_loops(b.busy), ui.progress(1 + n_prompts * per_prompt, "bench") as step:
            result = benchmark.run(
                target.model,
                target.tokenizer,
                items=items,
                drafts=drafts,
                max_tokens=g.max_tokens,
                sampling=opts.sampling,
                vocab_size=target.vocab_size,
                context_length=target.context_length,
                drafters_for=drafters_for,
                chat_template=g.chat_template,
                peer=peer,
                repeats=b.repeats,
                traces=traces,
                on_step=step,
                weights=weights,
            )
    finally:
        if peer is not None:
            peer.close()
    rows = report.summarize(result)
    choices = report.recommend_widths(rows) if plan.widths else []
    headers, body = columns(rows, b.vs)
    ui.table(f"mlxcel bench: {target.resolved.source}", headers, body, right_from=3 if weights else 2)
    overall = [r for r in rows if r.kind == ALL_KINDS]  # one row per configuration
    if overall:
        r0 = overall[0]
        ui.info(
            f"target only: {r0.plain_ms_per_token:.1f} ms/token, peak {r0.plain_peak_mib:.0f} MiB "
            f"(speculative peak {max(r.spec_peak_mib for r in overall):.0f} MiB); "
            f"BLAS {session.blas.name}, weights {target.dtype}, kernels {target.kernels}"
        )
    ratio = report.plain_vs_peer(result)
    if ratio is not None:
        ui.info(f"plain decode vs {b.vs} plain decode: {ratio:.2f}x (median over prompts)")
    prefill = report.prefill_vs_peer(result)
    if prefill is not None:
        ui.info(f"prefill: {prefill:.2f}x {b.vs}'s speed (its time to the first token over ours, median over prompts)")
    for r in (r for r in overall if r.identical < r.prompts):
        ui.warn(
            f"{r.config}: {r.prompts - r.identical} prompt(s) produced output different from plain decoding"
            + ("" if opts.sampling.greedy or opts.sampling.seed is not None else " (sampling without --seed)")
        )
    plot_path = None
    if plan.widths:
        plot_path = Path(b.plot_path or DEFAULT_PLOT)
        from .plot import plot_sweep

        name = target.resolved.source.split(" (")[0]
        plot_sweep(
            rows,
            choices,
            plot_path,
            title=f"mlxcel bench: {name}, {n_prompts} prompts, max {g.max_tokens} "
            f"tokens, BLAS {session.blas.name}, weights {target.dtype.split(' (')[0]}",
        )
        ui.info(f"plot: {plot_path}")
        _say_choices(choices)
    if b.json_path:
        data = report.to_json(
            result,
            rows,
            choices,
            command=["mlxcel", *sys.argv[1:]],
            model=target.resolved.source,
            blas=session.blas.name,
            weights=target.dtype,
            kernels=target.kernels,
            max_tokens=g.max_tokens,
            cpu_weights_modes={
                mode: m.weights.as_json() for mode, m in loaded_by_mode.items() if m.weights is not None
            },
            sampling=asdict(opts.sampling),
            workload=b.trace or b.workload or "built-in",
            trace=bool(b.trace),
            repeats=b.repeats,
            busy=b.busy,
            widths=list(plan.widths),
            plot=str(plot_path) if plot_path else None,
            peer=b.vs,
            versions=_versions(),
            machine=f"{platform.system()} {platform.machine()}",
        )
        try:
            Path(b.json_path).write_text(json.dumps(data, indent=2))
        except OSError as exc:
            raise MlxcelError(f"--json {b.json_path}: cannot write it ({exc.strerror})") from None
        ui.info(f"json: {b.json_path}")
    if b.markdown:
        ui.write_out(markdown(rows, b.vs))


def _say_choices(choices: Sequence[WidthChoice]) -> None:
    for c in choices:
        ui.info(
            f"recommended width for {c.drafter}: {c.width} (median speedup {c.speedup:.2f}x over all prompts; "
            f"narrowest within {report.WIDTH_TIE:.0%} of the best) -> {c.flag} {c.width}"
        )
