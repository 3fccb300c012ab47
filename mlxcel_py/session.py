"""From a validated RunConfig to a ready Engine, in one line of steps shared by every command:

    resolve the target -> the drafter's kind prepares it (checks against the target's files)
    -> load the target -> the prepared drafter loads -> Engine

Config-level refusals (missing or malformed config.json, the drafter's vocabulary and token ids,
DFlash folders, caches that cannot roll back) happen before any weight is read; what a drafter
needs is its kind's business (drafters/registry.py), never an if-chain here. Progress goes through
`say`, warnings through `warn`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .cpu import blas
from .drafters import registry
from .errors import ModelError
from .formats import chat_templates
from .formats.prompting import leading_bos
from .models import loading, preflight
from .options import RunConfig
from .vision import loading as vision_loading

if TYPE_CHECKING:
    from .engine.engine import Engine
    from .models.taps import HiddenTap
    from .parallel.distributed import World


@dataclass
class Session:
    target: loading.LoadedModel
    engine: Engine | None  # None on a distributed run's followers
    blas: blas.BlasState
    world: World | None = None  # a distributed run's
    tap: HiddenTap | None = None  # where every rank's forward ends (the final norm)

    @property
    def tokenizer(self):
        return self.target.tokenizer

    @property
    def drafters(self):
        """The engine's drafters.base.DrafterSource (None: plain decoding)."""
        return self.engine.drafters if self.engine is not None else None

    def save_store(self) -> str | None:
        """Write what the drafter keeps across runs (--suffix-store); returns what it did."""
        return self.drafters.save() if self.drafters is not None else None


def _resolve_target(run: RunConfig, world: Any) -> loading.ResolvedModel:
    """Resolve (a GGUF is converted once): on a distributed run rank 0 first, then the others
    find its conversion in a shared cache; the layout is checked before any weight loads."""
    from .parallel import distributed

    mopts = run.options.model
    if world is not None and not world.leader:
        distributed.barrier(world)
    spec = mopts.model
    if mopts.hf_repo is not None:  # llama.cpp's -hf: the cache's copy, or downloaded now
        from .models import hub

        spec = hub.fetch(mopts.hf_repo, mopts.hf_file)
    resolved = loading.resolve(spec, revision=mopts.revision, mmproj=None if world else mopts.mmproj)
    if world is not None and world.leader:
        distributed.barrier(world)
    preflight.check_target(resolved)
    if world is not None and (why := distributed.why_not_model(resolved.config, world.layout)):
        raise ModelError(
            f"{world.layout.flag}: {mopts.model or mopts.hf_repo or 'the default model'} cannot run split this way: {why}"
        )
    return resolved


def _hub_drafter(run: RunConfig) -> RunConfig:
    """-hfd OWNER/NAME[:QUANT]: the drafter from the cache, or downloaded now, as -hf fetches a model."""
    draft = run.draft
    if draft.draft_hub is None:
        return run
    from .models import hub

    path = hub.fetch(draft.draft_hub, draft.draft_hub_file, what="--spec-draft-hf", file_what="-md")
    return replace(run, draft=replace(draft, draft_model=path, draft_hub=None, draft_hub_file=None))


def open_follower(run: RunConfig, world: Any) -> Session:
    """A follower rank's part of the target model, ready to mirror rank 0's forwards."""
    from .models.taps import hidden_tap
    from .parallel import distributed

    state = blas.prepare(run.options.model.blas)
    mopts = run.options.model
    resolved = _resolve_target(run, world)
    target = loading.load(
        resolved,
        dequantize=mopts.dequantize,
        fast_kernels=mopts.fast_kernels,
        cpu_weights=mopts.cpu_weights,  # as rank 0's, so the stages run the same layers
        world=world,
        cache_types=mopts.cache_types,
    )
    distributed.barrier(world)
    return Session(target, None, state, world=world, tap=hidden_tap(target.model))


def open_session(
    run: RunConfig,
    *,
    say: Callable[[str], None] = lambda s: None,
    warn: Callable[[str], None] | None = None,
    world: Any = None,
) -> Session:
    for line in run.warnings:
        (warn or say)(line)
    run = _hub_drafter(run)
    state = blas.prepare(run.options.model.blas)
    mopts = run.options.model
    resolved = _resolve_target(run, world)
    if run.draft.enabled and registry.kind_of(run.draft.kind).reads_target and world is None and not mopts.no_mmproj:
        family = "a GGUF projector" if resolved.projector is not None else vision_loading.family(resolved.config)
        if family is not None:
            text_kinds = ", ".join(sorted(k.name for k in registry.KINDS.values() if not k.reads_target))
            raise ModelError(
                f"--draft-kind {run.draft.kind} reads the target's hidden states, which a vision model ({family}) "
                f"does not offer here; with images use {text_kinds}"
            )
    plan = registry.kind_of(run.draft.kind).prepare(run.draft, resolved, mopts) if run.draft.enabled else None
    if plan is not None:
        loading.check_rollback_config(resolved.config)
    if run.draft.tree_budget:
        loading.check_tree_config(resolved.config, tree_flag(run.draft))
    say(f"model: {resolved.source}")
    target = loading.load(
        resolved,
        dequantize=mopts.dequantize,
        fast_kernels=mopts.fast_kernels,
        cpu_weights=mopts.cpu_weights,
        world=world,
        cache_types=mopts.cache_types,
        text_only=mopts.no_mmproj,
        adapters=mopts.adapters,
    )
    if target.kv_note is not None:
        (warn or say)(target.kv_note)
    if target.adapters:
        say("adapters fused: " + ", ".join(f"{a.spec.path} at scale {a.spec.scale:g}" for a in target.adapters))
    if run.chat_template is not None:  # --chat-template: replaces the model's own (and any renderer)
        tok = target.tokenizer
        inner = getattr(tok, "_tokenizer", tok)
        inner.chat_template = chat_templates.with_vocab_bos(run.chat_template, leading_bos(inner) is not None)
        if hasattr(tok, "_chat_template"):
            tok._chat_template = None
        tok.has_chat_template = True
    channel = tap = None
    if world is not None:
        from .models.taps import hidden_tap
        from .parallel import distributed, mirror

        distributed.barrier(world)  # every rank holds its part
        tap = hidden_tap(target.model)
        channel = world.channel = mirror.Leader(world, tap)
        say(
            f"distributed: {world.layout.describe()} over {world.size} ranks ({world.backend} backend); "
            f"rank 0 runs the engine"
        )
    if target.weights is not None and target.weights.inexact:
        (warn or say)(
            f"--cpu-weights {mopts.cpu_weights}: speculative output may differ from plain output on this "
            f"model ({target.weights.inexact}); --cpu-weights auto picks f32 for it"
        )
    say(
        f"loaded in {target.load_seconds:.2f}s; weights {target.dtype}; BLAS {state.name}"
        + (f" ({state.path})" if state.path else f" ({state.note})")
        + f"; kernels {target.kernels}; KV cache {target.kv_summary}"
    )
    drafters = plan.load(target, say) if plan is not None else None
    if drafters is not None and run.draft.lookup_first:  # --prompt-lookup beside a model drafter
        from .drafters import composite

        drafters = composite.Source(drafters)
    from .engine.engine import Engine

    engine = Engine(
        target.model,
        eos_ids=target.tokenizer.eos_token_ids,
        vocab_size=target.vocab_size,
        # serve -c/--ctx-size: a smaller window than the model's (llama-server's n_ctx)
        context_length=context_window(run, target.context_length, world),
        drafters=drafters,
        channel=channel,
    )
    if run.draft.tree_budget and (why := engine.why_no_trees()):
        raise ModelError(f"{tree_flag(run.draft)}: draft trees cannot be verified here: {why}", hint="drop it")
    return Session(target, engine, state, world=world, tap=tap)


def tree_flag(draft) -> str:
    """What asked for draft trees, for a refusal to name."""
    return "--draft-tree-budget" + (" (or MLXCEL_MTP_TREE_BRANCHES)" if draft.kind == "mtp" else "")


def context_window(run: RunConfig, model_window: int, world: Any = None) -> int:
    """A request's window: serve's -c (or the model's), split across explicit -np slots as
    llama-server does (one slot under --tp-size/--pp-size, so no split there)."""
    srv = run.options.server
    window = min(model_window, srv.ctx_size or model_window)
    return window if world is not None else srv.slot_context(window)


def describe_draft(draft, *, max_batch: int | str | None = None) -> str:
    """The startup `speculative=...` line, with the policy as it will run (auto resolved)."""
    from .engine.policy import SHADOW_CONFIRM, on_cuda

    return registry.describe(draft, on_cuda=on_cuda(), shadow=SHADOW_CONFIRM, max_batch=max_batch)


resolved_drafter_line = registry.resolved_line
