"""`mlxcel bench`'s flags, checked before any model loads (pure, as validate.py is): the peer, the
repeats and limits, the width sweep, the tree budgets and weight modes it takes as lists, and the
runs it makes of the flags, each validated by the CLI's own `validate`."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

from ..drafters import registry
from ..errors import UsageError
from ..options import (
    CPU_WEIGHTS,
    MAX_BUSY,
    MAX_DRAFT_LIMIT,
    PEERS,
    BenchOptions,
    BenchPlan,
    CommandOptions,
    PromptLookupOptions,
    RunConfig,
)
from ..validate import check_tree_budget, lookup_tuning_flags, validate, with_trees


def _parse_widths(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        widths = tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(f"--sweep-widths {text}: expected comma-separated integers, e.g. 1,2,4,7,12") from None
    if not widths:
        raise UsageError("--sweep-widths needs at least one width, e.g. 1,2,4,7,12")
    for w in widths:
        if not 1 <= w <= MAX_DRAFT_LIMIT:
            raise UsageError(f"--sweep-widths: width {w} is outside 1..{MAX_DRAFT_LIMIT}")
    if len(set(widths)) != len(widths):
        raise UsageError(f"--sweep-widths {text}: a width is listed twice")
    return tuple(sorted(widths))


def validate_bench(opts: CommandOptions, bench: BenchOptions) -> BenchPlan:
    """`mlxcel bench`: the same rules as generate, except that --prompt-lookup and --draft-model
    given together benchmark each alone and the composite of the two, and with neither, prompt
    lookup is benchmarked.
    --cpu-weights may list several modes: the session loads the first, the others are loaded beside it."""
    weights = _parse_weights(opts.model.cpu_weights)
    opts = replace(opts, model=replace(opts.model, cpu_weights=weights[0]))
    if len(weights) > 1 and opts.spec.draft_kind == "mtp":
        raise UsageError(
            f"--cpu-weights {','.join(weights)}: the MTP head is loaded onto one target, so "
            f"--draft-kind mtp is benchmarked in one weight mode; pass one mode"
        )
    if bench.vs is not None and bench.vs not in PEERS:
        raise UsageError(f"--vs {bench.vs}: the peer to compare against must be one of {', '.join(PEERS)}")
    if bench.vs == "llama.cpp":
        spec = opts.model.model
        if (
            opts.model.hf_repo is not None
            or spec is not None
            and not (spec.endswith(".gguf") and Path(spec).expanduser().is_file())
        ):
            raise UsageError(
                "--vs llama.cpp runs llama.cpp on the same GGUF file: pass -m FILE.gguf "
                "(or omit -m for the default model)"
            )
        if importlib.util.find_spec("llama_cpp") is None:
            raise UsageError(
                "--vs llama.cpp needs llama-cpp-python, which is not installed",
                hint="pip install -e '.[llama]' (it builds llama.cpp from source, a few minutes)",
            )
    if bench.limit is not None and bench.limit < 1:
        raise UsageError(f"--limit must be at least 1, got {bench.limit}")
    if not 1 <= bench.repeats <= 100:
        raise UsageError(f"--repeats must be between 1 and 100, got {bench.repeats}")
    if not 0 <= bench.busy <= MAX_BUSY:
        raise UsageError(f"--busy must be between 0 and {MAX_BUSY}, got {bench.busy}")
    if opts.generation.max_tokens < 1:
        raise UsageError(f"--max-tokens must be at least 1 for a benchmark, got {opts.generation.max_tokens}")
    widths = _parse_widths(bench.sweep_widths) if bench.sweep_widths is not None else ()
    lk = opts.spec.lookup
    wants_model = bool(opts.model.draft_model) or opts.spec.draft_kind is not None
    wants_lookup = lk.enabled or not wants_model
    runs: list[RunConfig] = []
    if wants_model:
        no_lookup = replace(opts, spec=replace(opts.spec, lookup=PromptLookupOptions()))
        if lookup_tuning_flags(opts) and not lk.enabled:
            validate(opts)  # reports "requires --prompt-lookup"
        runs.append(validate(no_lookup))
    if wants_lookup:
        # beside a model drafter, --draft-block-size is that drafter's; alone it is refused
        only_lookup = replace(
            opts,
            model=replace(opts.model, draft_model=None),
            spec=replace(
                opts.spec,
                draft_kind=None,
                lookup=replace(lk, enabled=True),
                draft_block_size=None if wants_model else opts.spec.draft_block_size,
                suffix_cache_tokens=None,
            ),
        )
        runs.append(validate(only_lookup))
    if wants_model and lk.enabled and opts.model.draft_model and not widths:
        runs.append(validate(opts))  # both at once: the composite drafter (a width sweep: each alone)
    drafters = [r.draft for r in runs]
    drafts = tuple(registry.with_width(d, w) for d in drafters for w in widths) if widths else tuple(drafters)
    if bench.tree_budgets is not None:  # each drafter at each tree budget (0: its chains)
        drafts = tuple(
            with_trees(
                replace(opts, spec=replace(opts.spec, tree_budget=b, tree_margin=opts.spec.tree_margin if b else None)),
                d,
                None,
            )
            for d in drafts
            for b in _parse_tree_budgets(bench.tree_budgets)
        )
    primary = next((r for r in runs if r.draft.enabled and registry.kind_of(r.draft.kind).loads_weights), runs[0])
    return BenchPlan(run=primary, drafts=drafts, widths=widths, bench=bench, weights=weights)


def _parse_tree_budgets(raw: str) -> tuple[int, ...]:
    try:
        budgets = tuple(int(b) for b in raw.split(","))
    except ValueError:
        raise UsageError(f"--draft-tree-budget {raw}: a comma list of node counts (0: chains), e.g. 0,8") from None
    for b in budgets:
        check_tree_budget(b)
    if len(set(budgets)) != len(budgets):
        raise UsageError(f"--draft-tree-budget {raw}: a budget is listed twice")
    return budgets


def _parse_weights(raw: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in raw.split(","))
    for m in modes:
        if m not in CPU_WEIGHTS:
            raise UsageError(f"--cpu-weights {raw}: {m or 'an empty entry'} is not one of {', '.join(CPU_WEIGHTS)}")
    if len(set(modes)) != len(modes):
        raise UsageError(f"--cpu-weights {raw}: a mode is listed twice")
    return modes
