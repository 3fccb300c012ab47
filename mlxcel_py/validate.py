"""The validation layer: parsed options -> a validated RunConfig, or a UsageError (exit 2).

Pure (no MLX, no Typer, no model files; it only looks at paths the flags name and whether an
optional peer package is installed). Every documented incompatible combination is refused here,
before any model loads, with one line that names the flags and the fix. docs/validation.md lists
each rule and tests/test_validate.py has a test per rule. Checks that need a model's files run next
to loading: `preflight.py` (DFlash folders, drafter vocabulary, from the configs a resolve read)
and `loading.check_rollback_config` (caches, on a weightless instance).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from . import validate_loading
from .drafters import registry
from .errors import UsageError
from .formats import flag_texts, template_vars
from .formats.grammars import GrammarSpec
from .options import (
    CPU_WEIGHTS,
    DEFAULT_CPU_WEIGHTS,
    DEFAULT_MAX_DRAFT,
    DEFAULT_NGRAM_MAX,
    DEFAULT_NGRAM_MIN,
    DEFAULT_POLICY,
    DEFAULT_SUFFIX_CACHE_TOKENS,
    DEFAULT_TREE_MARGIN,
    DRAFT_ACCEPTANCE,
    MAX_DRAFT_LIMIT,
    MAX_PARALLEL,
    NGRAM_MAX_LIMIT,
    POLICIES,
    POOLINGS,
    REASONING_FORMATS,
    REPETITION_PENALTY_RANGE,
    TOOL_NAMES,
    CommandOptions,
    DraftConfig,
    LookupConfig,
    RunConfig,
    ToolsRuntimeSpec,
)
from .validate_cache import cache_types

LLAMA_NGRAM_SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
LLAMA_SPEC_TYPES = (
    "none",
    "draft-simple",
    "draft-mtp",
    "draft-dflash",
    "draft-eagle3",
    "draft-dspark",
    "draft-mtp-adaptive",
    *LLAMA_NGRAM_SPEC_TYPES,
)


def lookup_tuning_flags(opts: CommandOptions) -> list[str]:
    lk = opts.spec.lookup
    given = []
    if lk.ngram_max is not None:
        given.append("--prompt-lookup-ngram-max")
    if lk.ngram_min is not None:
        given.append("--prompt-lookup-ngram-min")
    if lk.max_draft is not None:
        given.append("--prompt-lookup-max-draft")
    if lk.no_adaptive:
        given.append("--prompt-lookup-no-adaptive")
    if lk.policy is not None:
        given.append("--prompt-lookup-policy")
    return given


def validate_lookup_bounds(
    ngram_min: int, ngram_max: int, max_draft: int, *, flag: str = "--prompt-lookup-max-draft"
) -> None:
    if ngram_min < 1:
        raise UsageError("--prompt-lookup-ngram-min must be at least 1")
    if ngram_max > NGRAM_MAX_LIMIT:
        raise UsageError(f"--prompt-lookup-ngram-max ({ngram_max}) must be at most {NGRAM_MAX_LIMIT}")
    if ngram_max < ngram_min:
        raise UsageError(f"--prompt-lookup-ngram-max ({ngram_max}) must be >= --prompt-lookup-ngram-min ({ngram_min})")
    if max_draft < 1:
        raise UsageError(f"{flag} must be at least 1")
    if max_draft > MAX_DRAFT_LIMIT:
        raise UsageError(f"{flag} ({max_draft}) must be at most {MAX_DRAFT_LIMIT}")


CLI_SAMPLING_NAMES = {
    "temp": "--temp",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "min_p": "--min-p",
    "repetition_penalty": "--repetition-penalty",
    "repeat_last_n": "--repeat-last-n",
    "seed": "--seed",
}


def check_sampling(s, names: dict[str, str] = CLI_SAMPLING_NAMES) -> None:
    """Sampling ranges, for the CLI and the HTTP server alike (`names` spells each field)."""
    n = names
    if s.temp < 0:
        raise UsageError(f"{n['temp']} must be >= 0 (0 is greedy), got {s.temp}")
    if not 0.0 < s.top_p <= 1.0:
        raise UsageError(f"{n['top_p']} must be in (0, 1], got {s.top_p}")
    if s.top_k < 0:
        raise UsageError(f"{n['top_k']} must be >= 0 (0 turns it off), got {s.top_k}")
    if not 0.0 <= s.min_p <= 1.0:
        raise UsageError(f"{n['min_p']} must be in [0, 1], got {s.min_p}")
    lo, hi = REPETITION_PENALTY_RANGE
    if not lo <= s.repetition_penalty <= hi:
        raise UsageError(
            f"{n['repetition_penalty']} must be between {lo:g} and {hi:g} (1.0 turns it off), got {s.repetition_penalty}"
        )
    if not math.isfinite(s.temp):
        raise UsageError(f"{n['temp']} must be a finite number >= 0 (0 is greedy), got {s.temp}")
    if s.repeat_last_n < -1:
        raise UsageError(f"{n['repeat_last_n']} must be -1 (whole context), 0 (off) or positive, got {s.repeat_last_n}")
    if s.seed is not None and s.seed < -1:
        raise UsageError(f"{n['seed']} must be -1 (random) or >= 0, got {s.seed}")


def _sampling(opts: CommandOptions) -> None:
    check_sampling(opts.sampling)


def _generation(opts: CommandOptions) -> None:
    g = opts.generation
    if g.max_tokens < -1:
        raise UsageError(f"--max-tokens must be -1 (until EOS or the context window) or >= 0, got {g.max_tokens}")
    if g.min_tokens < 0:
        raise UsageError(f"--min-tokens must be >= 0, got {g.min_tokens}")
    if g.max_tokens >= 0 and g.min_tokens > g.max_tokens:
        raise UsageError(f"--min-tokens ({g.min_tokens}) must not exceed --max-tokens ({g.max_tokens})")
    if opts.model.mmproj is not None and opts.model.no_mmproj:
        raise UsageError("--mmproj and --no-mmproj contradict each other; drop one of them")
    if opts.model.mmproj is not None and opts.parallel.active:
        raise UsageError(f"--mmproj: {opts.parallel.flag} runs are text-only; drop one of them")
    if g.images and opts.model.no_mmproj:
        raise UsageError("--image needs the vision model, which --no-mmproj leaves out; drop one of them")
    if g.audio or g.video:
        flag = "--audio" if g.audio else "--video"
        raise UsageError(f"{flag}: audio and video input are not supported (images are, with --image); drop {flag}")
    if g.images and opts.parallel.active:
        raise UsageError(f"--image: {opts.parallel.flag} runs are text-only; drop one of them")


def _spec_type(opts: CommandOptions, kind: str | None, draft_model: str | None) -> tuple[str | None, str | None, bool]:
    """Apply llama-server's --spec-type: returns (kind, draft_model, speculation_off)."""
    st = opts.spec.spec_type
    if st is None:
        return kind, draft_model, False
    values = [v.strip() for v in st.split(",") if v.strip()]
    for v in values:
        if v not in LLAMA_SPEC_TYPES:
            raise UsageError(
                f"--spec-type {v} is not a llama-server speculation type mlxcel-py recognizes; "
                f"accepted: none, draft-simple"
            )
    if "none" in values and len(values) > 1:
        raise UsageError("--spec-type none cannot be combined with another type; pick one")
    if len(set(values)) > 1:
        raise UsageError(f"--spec-type {st}: one speculative subsystem per run; pick one type")
    v = values[0]
    if v == "none":
        return None, None, True
    if v in LLAMA_NGRAM_SPEC_TYPES:
        raise UsageError(
            f"--spec-type {v} is not supported: llama-server's n-gram modes have no mlxcel-py "
            f"equivalent; use --draft-kind prompt-lookup (serve) or --prompt-lookup (generate)"
        )
    entry = registry.by_spec_type(v)
    if entry is not None and entry.module is not None:
        if kind not in (None, entry.name):
            raise UsageError(f"--spec-type {v} conflicts with --draft-kind {kind}: pick one")
        return entry.name, draft_model, False
    raise UsageError(
        f"--spec-type {v} is not supported: mlxcel-py has no {v.removeprefix('draft-')} drafter; "
        f"use --spec-type draft-simple with --draft-model, or drop the flag"
    )


def validate(opts: CommandOptions) -> RunConfig:
    """Check one command's options; return the resolved run configuration."""
    _window(opts.server)
    validate_loading.hub_model(opts)
    validate_loading.adapter(opts)
    if opts.command == "serve":
        _server(opts)
    grammar = flag_texts.grammar(opts)
    template = flag_texts.chat_template(opts)
    opts, cache_notes = cache_types(opts)
    run = _validate(opts)
    run = replace(run, draft=with_trees(opts, run.draft, grammar))
    if opts.spec.draft_min:
        run = replace(run, draft=replace(run.draft, min_draft=opts.spec.draft_min))
    notes = cache_notes + (_server_notes(opts) if opts.command == "serve" else ())
    notes += _tree_notes(opts, run.draft) if opts.command == "serve" else ()
    run = replace(run, grammar=grammar, chat_template=template)
    return replace(run, warnings=run.warnings + notes) if notes else run


def with_trees(opts: CommandOptions, draft: DraftConfig, grammar: GrammarSpec | None) -> DraftConfig:
    """--draft-tree-budget / --draft-tree-margin (engine/tree.py), or on --draft-kind mtp mlxcel's
    MLXCEL_MTP_TREE_BRANCHES / MLXCEL_MTP_TREE_MARGIN. Whether the model's caches can hold a tree
    is checked against its config before any weight loads (session)."""
    spec = opts.spec
    budget, budget_flag = spec.tree_budget, "--draft-tree-budget"
    margin, margin_flag = spec.tree_margin, "--draft-tree-margin"
    if draft.kind == "mtp":  # mlxcel's names; a flag given wins
        if budget is None and spec.mtp_tree_branches is not None:
            budget_flag = "MLXCEL_MTP_TREE_BRANCHES"
            budget = _number(int, spec.mtp_tree_branches, budget_flag, "a whole number of nodes")
        if margin is None and spec.mtp_tree_margin is not None:
            margin_flag = "MLXCEL_MTP_TREE_MARGIN"
            margin = _number(float, spec.mtp_tree_margin, margin_flag, "a logit gap")
    if budget is not None:
        check_tree_budget(budget, budget_flag)
    if margin is not None and (math.isnan(margin) or margin < 0):
        raise UsageError(f"{margin_flag} must be a logit gap of 0 or more (inf: branch everywhere), got {margin}")
    if not budget:
        if margin is not None:
            raise UsageError(f"{margin_flag} requires --draft-tree-budget N (N > 0); add it or drop {margin_flag}")
        return draft
    if not draft.enabled:
        raise UsageError(
            f"{budget_flag} {budget} needs a drafter: add --prompt-lookup, --draft-model PATH or --draft-kind KIND"
        )
    if margin is not None and not registry.kind_of(draft.kind).loads_weights:
        raise UsageError(
            f"{margin_flag} applies to model drafters' trees (full-model, mtp, dflash, eagle3); "
            f"{draft.kind} trees branch where earlier text did; drop {margin_flag}"
        )
    if opts.parallel.active:
        raise UsageError(f"{budget_flag} does not run under {opts.parallel.flag}: draft trees verify in one process")
    if opts.command != "serve" and not opts.sampling.greedy:
        raise UsageError(
            f"{budget_flag} {budget}: draft trees are verified greedily only (the lossless rule for sampled "
            f"drafts covers one candidate per position)",
            hint="use --temp 0, or drop the flag to verify chains",
        )
    if grammar is not None:
        raise UsageError(
            f"{budget_flag} does not combine with a grammar or JSON schema (constrained rounds verify chains); drop one"
        )
    return replace(draft, tree_budget=budget, tree_margin=margin if margin is not None else DEFAULT_TREE_MARGIN)


def _number(kind: type, text: str, name: str, what: str):
    try:
        return kind(text.strip())
    except ValueError:
        raise UsageError(f"{name}={text!r} is not {what}") from None


def check_tree_budget(budget: int, flag: str = "--draft-tree-budget") -> None:
    if not 0 <= budget <= MAX_DRAFT_LIMIT:
        raise UsageError(f"{flag} must be between 0 (chains) and {MAX_DRAFT_LIMIT} nodes, got {budget}")


def _tree_notes(opts: CommandOptions, draft: DraftConfig) -> tuple[str, ...]:
    """serve: a request that samples verifies chains; say so where the server's default samples."""
    if draft.tree_budget and (opts.sampling.temp != 0 or "temp" not in opts.server.sampling_given):
        return (
            "--draft-tree-budget: draft trees apply to greedy requests (temperature 0); requests that "
            "sample (the server's default unless --temp 0) verify chains",
        )
    return ()


MIN_SLOT_CONTEXT = 16  # tokens: a slot's share of -c must hold a short prompt and its reply


def _window(srv) -> None:
    """-c, --keep: every command's context window (llama.cpp's flags)."""
    if (c := srv.ctx_size) < 0:
        raise UsageError(f"--ctx-size must be 0 (the model's window) or a positive number of tokens, got {c}")
    if srv.keep < -1:
        raise UsageError(f"--keep must be -1 (the whole prompt) or 0 or more tokens, got {srv.keep}")


def _server(opts: CommandOptions) -> None:
    srv = opts.server
    for flag, folder in (
        ("--slot-save-path", srv.slot_save_path),
        ("--media-path", srv.media_path),
        ("--models-dir", srv.models_dir),
    ):
        if folder is not None and not Path(folder).is_dir():
            raise UsageError(f"{flag} {folder}: no such folder; create it or pass another")
    if srv.image_url_allow and not srv.image_url_fetch:
        raise UsageError("--image-url-allow names hosts --image-url-fetch may download from; add --image-url-fetch")
    if srv.pooling not in POOLINGS:
        raise UsageError(f"--pooling {srv.pooling} is not one of {', '.join(POOLINGS)}, rank")
    if not 1 <= srv.parallel <= MAX_PARALLEL:
        raise UsageError(f"--parallel (-np) must be between 1 and {MAX_PARALLEL}, got {srv.parallel}")
    if srv.split_context and 0 < srv.ctx_size < srv.parallel * MIN_SLOT_CONTEXT:
        raise UsageError(
            f"--ctx-size {srv.ctx_size} split across -np {srv.parallel} leaves {srv.ctx_size // srv.parallel} "
            f"tokens a slot (at least {MIN_SLOT_CONTEXT}); raise -c, lower -np, or give -kvu (one shared window)"
        )
    if srv.reasoning_format not in REASONING_FORMATS:
        raise UsageError(f"--reasoning-format {srv.reasoning_format} is not one of {', '.join(REASONING_FORMATS)}")
    template_vars.check(srv)
    if srv.shutdown_grace < 0:
        raise UsageError(f"--shutdown-grace must be 0 or more seconds, got {srv.shutdown_grace}")
    validate_loading.serving(opts)
    if srv.max_predict_ms < 0:
        raise UsageError(f"--max-predict-ms must be 0 (no limit) or more milliseconds, got {srv.max_predict_ms}")
    if srv.threads is not None and srv.threads < 1:
        raise UsageError(f"--threads (-t) must be at least 1, got {srv.threads}")
    _tools(srv)


def _tools(srv) -> None:
    """--tools names and --tools-runtime's spec, checked before anything loads or starts."""
    if bad := [n for n in srv.tools if n != "all" and n not in TOOL_NAMES]:
        raise UsageError(f"--tools: unknown tool {bad[0]!r}; available tools: {', '.join(TOOL_NAMES)} (or all)")
    if srv.tools_runtime is None:
        return
    if not srv.tools:
        raise UsageError("--tools-runtime says where --tools run; add --tools")
    try:
        ToolsRuntimeSpec.parse(srv.tools_runtime)
    except ValueError as exc:
        raise UsageError(f"--tools-runtime: {exc}") from None


def _server_notes(opts: CommandOptions) -> tuple[str, ...]:
    """llama-server flags that are accepted but change nothing here: one line each, not an error."""
    srv = opts.server
    notes = [f"{flag} is a llama.cpp setting that does not apply to MLX; ignored" for flag in srv.ignored]
    return tuple(notes)


def _cpu_weights(opts: CommandOptions) -> None:
    m = opts.model
    if m.cpu_weights not in CPU_WEIGHTS:
        hint = " (a comma list is a bench option)" if "," in m.cpu_weights else ""
        raise UsageError(f"--cpu-weights {m.cpu_weights} is not one of {', '.join(CPU_WEIGHTS)}{hint}")
    if not m.dequantize and m.cpu_weights != DEFAULT_CPU_WEIGHTS:
        raise UsageError(
            f"--no-dequantize keeps MLX's own quantized matmul and conflicts with --cpu-weights "
            f"{m.cpu_weights}; drop one of them"
        )


def _parallel(opts: CommandOptions) -> None:
    """--tp-size / --pp-size against each other and against what cannot be sharded."""
    par = opts.parallel
    for flag, n in (("--tp-size", par.tp_size), ("--pp-size", par.pp_size)):
        if n < 1:
            raise UsageError(f"{flag} must be at least 1, got {n}")
    if not par.active:
        return
    if par.tp_size > 1 and par.pp_size > 1:
        raise UsageError(
            f"--tp-size {par.tp_size} with --pp-size {par.pp_size}: a 2-D layout is not supported; pick one of them"
        )
    if opts.generation.verify_exact:
        raise UsageError(f"--verify-exact does not run under {par.flag}; drop one of them")


def _validate(opts: CommandOptions) -> RunConfig:
    if opts.sampling.seed == -1:  # -1 means a random seed, as in mlxcel-server and our HTTP API
        opts = replace(opts, sampling=replace(opts.sampling, seed=None))
    cmd = opts.command
    _cpu_weights(opts)
    _parallel(opts)
    _sampling(opts)
    _generation(opts)
    spec = opts.spec
    lk = spec.lookup
    tuning = lookup_tuning_flags(opts)
    kind = spec.draft_kind
    # the drafter's name, whichever flag gave it (-hfd's repo; -md beside it names a file of the repo)
    draft_hub = opts.model.draft_hf
    draft_model = draft_hub or opts.model.draft_model

    if kind is not None and kind not in registry.KINDS:
        raise UsageError(f'--draft-kind="{kind}" is not recognised; accepted values: {", ".join(registry.KINDS)}')
    if spec.draft_block_size is not None and spec.draft_block_size < 1:
        raise UsageError(f"--draft-block-size must be at least 1, got {spec.draft_block_size}")
    if spec.draft_block_size is not None and spec.draft_block_size > MAX_DRAFT_LIMIT:
        raise UsageError(f"--draft-block-size ({spec.draft_block_size}) must be at most {MAX_DRAFT_LIMIT}")
    if spec.draft_acceptance is not None and spec.draft_acceptance not in DRAFT_ACCEPTANCE:
        raise UsageError(f"--draft-acceptance {spec.draft_acceptance!r} is not one of: {', '.join(DRAFT_ACCEPTANCE)}")
    if spec.draft_min is not None and not 0 <= spec.draft_min <= MAX_DRAFT_LIMIT:
        raise UsageError(f"--draft-min must be between 0 and {MAX_DRAFT_LIMIT}, got {spec.draft_min}")
    par = opts.parallel

    if lk.enabled and cmd not in ("generate", "bench"):
        raise UsageError(
            f"--prompt-lookup is a generate option; on {cmd} use "
            + ("--draft-kind prompt-lookup" if cmd == "serve" else "mlxcel generate -p TEXT --prompt-lookup")
        )
    if tuning and not lk.enabled:
        raise UsageError(f"{tuning[0]} requires --prompt-lookup; add --prompt-lookup or drop {tuning[0]}")
    # --prompt-lookup beside a drafter checkpoint: the composite drafter (drafters/composite.py)
    composite = lk.enabled and bool(draft_model)
    if lk.enabled and kind not in (None, "prompt-lookup") and not (composite and registry.kind_of(kind).loads_weights):
        raise UsageError(f"--prompt-lookup conflicts with --draft-kind {kind}: one drafter per run; drop one of them")
    if lk.enabled and spec.draft_block_size is not None and not composite:
        raise UsageError(
            "--draft-block-size (--draft-max) does not apply to --prompt-lookup; use --prompt-lookup-max-draft N"
        )
    if lk.enabled and spec.spec_type is not None:
        raise UsageError(
            f"--spec-type {spec.spec_type} selects a server drafter and does not combine with "
            f"--prompt-lookup; drop one of them"
        )
    if opts.generation.verify_exact and cmd not in ("generate", "run"):
        raise UsageError(f"--verify-exact is a generate/run option (it reruns one prompt plainly); drop it on {cmd}")
    if cmd == "serve" and opts.server.cache_ram < -1:
        raise UsageError(f"--cache-ram must be -1 (no limit), 0 (off) or a size in MiB, got {opts.server.cache_ram}")
    if cmd == "serve" and (mb := opts.server.prompt_lookup_max_batch) is not None and (isinstance(mb, str) or mb < 1):
        words = f"takes a count or auto, got {mb!r}" if isinstance(mb, str) else "must be at least 1"
        raise UsageError(f"--prompt-lookup-max-batch {words}")
    _suffix_flags(opts, kind)
    if kind == "prompt-lookup" and cmd in ("generate", "run", "chat", "bench"):
        raise UsageError(
            "--draft-kind=prompt-lookup takes no drafter checkpoint; pass --prompt-lookup instead "
            "(see --prompt-lookup-* for its settings)"
        )
    if kind == "prompt-lookup" and draft_model:
        raise UsageError("prompt-lookup takes no draft model; remove --draft-model/--model-draft")

    kind, draft_model, spec_off = _spec_type(opts, kind, draft_model)
    if spec_off:
        dropped = (
            (f"--spec-type none: the drafter {draft_hub or opts.model.draft_model} is dropped; decoding plainly",)
            if draft_hub or opts.model.draft_model
            else ()
        )
        return RunConfig(opts, DraftConfig(), warnings=dropped)

    if lk.enabled:
        g = opts.generation
        if g.prompt is None and cmd == "generate":
            raise UsageError(
                "--prompt-lookup needs a one-shot prompt (-p/--prompt); interactive chat does not support prompt lookup"
            )
        if par.pp_size > 1:
            raise UsageError("--prompt-lookup does not support pipeline parallelism (--pp-size > 1); drop one")
        cfg = LookupConfig(
            ngram_min=lk.ngram_min if lk.ngram_min is not None else DEFAULT_NGRAM_MIN,
            ngram_max=lk.ngram_max if lk.ngram_max is not None else DEFAULT_NGRAM_MAX,
            max_draft=lk.max_draft if lk.max_draft is not None else DEFAULT_MAX_DRAFT,
            adaptive=not lk.no_adaptive,
            policy=lk.policy or DEFAULT_POLICY,
        )
        if cfg.policy not in POLICIES:
            raise UsageError(f"--prompt-lookup-policy {cfg.policy} is not one of {', '.join(POLICIES)}")
        if lk.ngram_min is not None and lk.ngram_max is None and cfg.ngram_min > cfg.ngram_max:
            cfg = replace(cfg, ngram_max=min(cfg.ngram_min, NGRAM_MAX_LIMIT))
        validate_lookup_bounds(cfg.ngram_min, cfg.ngram_max, cfg.max_draft)
        if not composite:
            return RunConfig(opts, DraftConfig(kind="prompt-lookup", lookup=cfg))

    if kind is None and not draft_model:
        return RunConfig(opts, DraftConfig())
    # a drafter checkpoint alone means a full model drafter (llama-server's -md)
    entry = registry.kind_of(kind or "full-model")
    if entry.checkpoint == registry.REQUIRED and not draft_model:
        raise UsageError(f"--draft-kind {entry.name} needs --draft-model PATH")
    if entry.checkpoint == registry.NONE and draft_model:
        raise UsageError(f"--draft-kind {entry.name} takes no drafter checkpoint; remove --draft-model")
    if par.active and not entry.parallel:
        raise UsageError(
            f"{entry.named} does not run under {par.flag} (the {entry.unsharded} is not sharded); drop one"
        )
    if par.pp_size > 1 and "pp" not in entry.parallel:
        raise UsageError(f"{entry.named} does not support pipeline parallelism (--pp-size > 1); drop one")
    explicit_block = spec.draft_block_size is not None
    block = spec.draft_block_size if explicit_block else entry.default_width
    if entry.anchored and block < 2:
        raise UsageError(
            f"--draft-block-size {block}: a {entry.name} block's first row is the last committed token, so "
            f"it drafts block size - 1 tokens; pass 2 or more"
        )
    adaptive = LookupConfig(max_draft=block, policy=entry.default_policy)
    lookup = cfg if lk.enabled else adaptive if entry.sizing == registry.ADAPTIVE else LookupConfig()
    return RunConfig(
        opts,
        DraftConfig(
            kind=entry.name,
            lookup=lookup,
            draft_model=draft_model or None,
            draft_hub=draft_hub,
            draft_hub_file=opts.model.draft_model if draft_hub else None,
            block_size=block,
            block_explicit=explicit_block,
            kind_explicit=kind is not None,
            suffix_cache_tokens=spec.suffix_cache_tokens or DEFAULT_SUFFIX_CACHE_TOKENS,
            suffix_store=spec.suffix_store,
            lookup_first=lk.enabled,
            acceptance=spec.draft_acceptance or DRAFT_ACCEPTANCE[0],
        ),
    )


def _suffix_flags(opts: CommandOptions, kind: str | None) -> None:
    spec = opts.spec
    flag = (
        "--suffix-cache-tokens"
        if spec.suffix_cache_tokens is not None
        else "--suffix-store"
        if spec.suffix_store is not None
        else None
    )
    if flag and kind != "suffix":
        raise UsageError(f"{flag} requires --draft-kind suffix; add it or drop {flag}")
    if spec.suffix_cache_tokens is not None and spec.suffix_cache_tokens < 1:
        raise UsageError(f"--suffix-cache-tokens must be at least 1, got {spec.suffix_cache_tokens}")
    if spec.suffix_store is not None:
        store = Path(spec.suffix_store).expanduser()
        if store.is_dir():
            raise UsageError(f"--suffix-store {spec.suffix_store}: a folder; pass a file path")
        if not store.parent.is_dir():
            raise UsageError(f"--suffix-store {spec.suffix_store}: the folder {store.parent} does not exist")
