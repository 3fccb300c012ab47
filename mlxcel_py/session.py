"""From a validated RunConfig to a ready Engine: resolve, preflight, load, check, build.

Shared by generate, run, chat, serve and bench so every command loads models and refuses bad
pairings the same way. Config-level refusals (missing/malformed config.json, drafter vocabulary,
DFlash folders) happen before any weight is read; model-level ones (cache rollback, token-id
maps) right after loading, before generation. Reports progress through a `say` callback.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from .cpu import blas as fastpath
from .models import loading
from .errors import ModelError
from .options import DEFAULT_MTP_BLOCK, DraftConfig, RunConfig
from .engine.policy import SHADOW_CONFIRM
from .models import preflight


@dataclass
class Session:
    target: loading.LoadedModel
    draft: loading.LoadedModel | None
    engine: Any  # engine.Engine
    blas: fastpath.BlasState
    store_fingerprint: str | None = None  # the tokenizer a saved suffix store belongs to
    world: Any = None  # distributed.World of a distributed run (engine is None on its followers)
    tap: Any = None  # mtp.HiddenTap: where every rank's forward ends (the final norm)

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def save_store(self) -> str | None:
        """Write the suffix store to --suffix-store, if one was asked for; returns what it did."""
        d, store = self.engine.draft, self.engine.suffix_store
        if d.kind != "suffix" or not d.suffix_store or store is None:
            return None
        path = Path(d.suffix_store).expanduser()
        try:
            store.save(path, self.store_fingerprint)
        except OSError as exc:
            raise ModelError(f"--suffix-store {d.suffix_store}: cannot write it ({exc.strerror})") from None
        return f"suffix store: {len(store)} sequences, {store.tokens} tokens saved to {path}"


def _check_token_ids(target_tok: Any, draft_tok: Any, draft_path: Any) -> None:
    """Same vocabulary size proves nothing; the id of every drafter token must match the target's."""
    tv = target_tok.get_vocab() if hasattr(target_tok, "get_vocab") else None
    dv = draft_tok.get_vocab() if hasattr(draft_tok, "get_vocab") else None
    if tv is None or dv is None:
        return
    mismatched = [t for t, i in dv.items() if tv.get(t) != i]
    if mismatched:
        example = mismatched[0]
        raise ModelError(
            f"--draft-model {draft_path}: its tokenizer maps {len(mismatched)} token(s) to different ids than the "
            f"target's (e.g. {example!r}: drafter {dv[example]}, target {tv.get(example)}); pick a drafter from "
            f"the target's family"
        )


def _mtp_source(run: RunConfig, resolved: loading.ResolvedModel):
    """Find the MTP head (the target's own, or --draft-model DIR), before any weight loads."""
    from .drafters import mtp

    folder = cfg = None
    if run.draft.draft_model:
        d = loading.resolve(run.draft.draft_model, what="--draft-model")
        folder, cfg = d.path, d.config
    return mtp.find_head(resolved.config, resolved.path, cfg, folder)


def _resolve_target(run: RunConfig, world: Any) -> loading.ResolvedModel:
    """Resolve (a GGUF is converted once): on a distributed run rank 0 first, then the others
    find its conversion in a shared cache; the layout is checked before any weight loads."""
    from .parallel import distributed

    mopts = run.options.model
    if world is not None and not world.leader:
        distributed.barrier(world)
    resolved = loading.resolve(mopts.model, revision=mopts.revision)
    if world is not None and world.leader:
        distributed.barrier(world)
    preflight.check_target(resolved)
    if world is not None and (why := distributed.why_not_model(resolved.config, world.layout)):
        raise ModelError(f"{world.layout.flag}: {mopts.model or 'the default model'} cannot run split this way: {why}")
    return resolved


def open_follower(run: RunConfig, world: Any) -> Session:
    """A follower rank's part of the target model, ready to mirror rank 0's forwards."""
    from .parallel import distributed
    from .drafters.mtp import hidden_tap

    blas = fastpath.prepare(run.options.model.blas)
    mopts = run.options.model
    resolved = _resolve_target(run, world)
    target = loading.load(resolved, dequantize=mopts.dequantize, fast_kernels=mopts.fast_kernels, world=world)
    distributed.barrier(world)
    return Session(target, None, None, blas, world=world, tap=hidden_tap(target.model))


def open_session(run: RunConfig, *, say: Callable[[str], None] = lambda s: None,
                 warn: Callable[[str], None] | None = None, world: Any = None) -> Session:
    for line in run.warnings:
        (warn or say)(line)
    blas = fastpath.prepare(run.options.model.blas)
    mopts = run.options.model
    resolved = _resolve_target(run, world)
    draft_resolved = None
    head_source = None
    if run.draft.kind == "full-model":
        draft_resolved = loading.resolve(run.draft.draft_model, what="--draft-model")
        from .drafters import mtp

        if mtp.is_mtp_checkpoint(draft_resolved.config):
            if run.draft.kind_explicit:
                raise ModelError(f"--draft-model {run.draft.draft_model} is an MTP head "
                                 f"({draft_resolved.config.get('model_type')}), not a standalone model; "
                                 f"use --draft-kind mtp")
            # as the seed page says: an MTP checkpoint given as the drafter means the mtp kind
            run = replace(run, draft=replace(run.draft, kind="mtp",
                                             block_size=run.draft.block_size if run.draft.block_explicit
                                             else DEFAULT_MTP_BLOCK))
            draft_resolved = None
        else:
            preflight.check_drafter(resolved, draft_resolved)
            _check_token_ids(loading.load_tokenizer_only(resolved), loading.load_tokenizer_only(draft_resolved),
                             run.draft.draft_model)
            loading.check_rollback_config(draft_resolved.config, what="the draft model")
    if run.draft.kind == "mtp":
        head_source = _mtp_source(run, resolved)
        if not run.draft.block_explicit and head_source.declared_width:
            run = replace(run, draft=replace(run.draft, block_size=head_source.declared_width))
    store, fingerprint = None, None
    if run.draft.kind == "suffix":
        store, fingerprint = _suffix_store(run.draft, resolved)
    if run.draft.enabled:
        loading.check_rollback_config(resolved.config)
    say(f"model: {resolved.source}")
    target = loading.load(resolved, dequantize=mopts.dequantize, fast_kernels=mopts.fast_kernels,
                          cpu_weights=mopts.cpu_weights, world=world)
    channel = tap = None
    if world is not None:
        from .parallel import distributed
        from .drafters.mtp import hidden_tap

        distributed.barrier(world)  # every rank holds its part
        tap = hidden_tap(target.model)
        channel = world.channel = distributed.Leader(world, tap)
        say(f"distributed: {world.layout.describe()} over {world.size} ranks ({world.backend} backend); "
            f"rank 0 runs the engine")
    if target.weights is not None and target.weights.inexact:
        (warn or say)(f"--cpu-weights {mopts.cpu_weights}: speculative output may differ from plain output on this "
                      f"model ({target.weights.inexact}); --cpu-weights auto picks f32 for it")
    say(f"loaded in {target.load_seconds:.2f}s; weights {target.dtype}; BLAS {blas.name}"
        + (f" ({blas.path})" if blas.path else f" ({blas.note})") + f"; kernels {target.kernels}")
    draft = None
    if draft_resolved is not None:
        draft = loading.load(draft_resolved, dequantize=mopts.dequantize, fast_kernels=mopts.fast_kernels,
                             cpu_weights=mopts.cpu_weights)
        say(f"draft model: {draft_resolved.source} ({draft.dtype})")
    head = None
    if head_source is not None:
        from .drafters import mtp

        head = mtp.load_head(target.model, head_source, resolved.path)
        say(f"MTP head: {len(head_source.tensors)} tensors from {head_source.where}")
    from .engine.engine import Engine

    engine = Engine(
        target.model,
        eos_ids=target.tokenizer.eos_token_ids,
        vocab_size=target.vocab_size,
        # serve -c/--ctx-size: a smaller window than the model's (llama-server's n_ctx)
        context_length=min(target.context_length, run.options.server.ctx_size or target.context_length),
        draft=run.draft,
        draft_model=draft.model if draft else None,
        mtp_head=head,
        suffix_store=store,
        channel=channel,
    )
    if store is not None and len(store):
        say(f"suffix store: {len(store)} sequences, {store.tokens} tokens from {run.draft.suffix_store}")
    return Session(target, draft, engine, blas, fingerprint, world=world, tap=tap)


def _suffix_store(draft: DraftConfig, resolved: loading.ResolvedModel):
    """A new store, or the one saved at --suffix-store, checked before any weight loads."""
    from .drafters.suffix import SuffixStore, fingerprint

    tok = loading.load_tokenizer_only(resolved)
    fp = fingerprint(tok.get_vocab() if hasattr(tok, "get_vocab") else None, resolved.config.get("vocab_size"))
    path = Path(draft.suffix_store).expanduser() if draft.suffix_store else None
    if path is None or not path.exists():
        return SuffixStore(draft.suffix_cache_tokens), fp
    try:
        return SuffixStore.load(path, fp, draft.suffix_cache_tokens, resolved.config.get("vocab_size")), fp
    except ValueError as exc:
        raise ModelError(f"--suffix-store {draft.suffix_store}: {exc}",
                         hint="delete the file or pass another --suffix-store path") from None
    except OSError as exc:
        raise ModelError(f"--suffix-store {draft.suffix_store}: cannot read it ({exc.strerror})") from None


def resolved_drafter_line(draft: DraftConfig) -> str | None:
    """mlxcel's line for model drafters: which kind runs, at which width, and where it came from."""
    if draft.kind not in ("full-model", "mtp"):
        return None
    return (f"Resolved drafter kind: {draft.kind} (block_size = {draft.block_size}, "
            f"{'explicit' if draft.block_explicit else 'default'})")


def describe_draft(draft: DraftConfig) -> str:
    """The startup `speculative=...` line, with the policy as it will run (auto resolved)."""
    if draft.kind == "prompt-lookup":
        lk = draft.lookup
        if not lk.adaptive:
            pol = "fixed"
        elif lk.policy == "auto":
            from .engine.engine import on_cuda

            pol = "gated" if on_cuda() else "graded"
        else:
            pol = lk.policy
        extra = f", shadow_confirm_tokens={SHADOW_CONFIRM}" if pol == "gated" else ""
        return (f"speculative=prompt-lookup (max_draft={lk.max_draft}, ngram={lk.ngram_min}..{lk.ngram_max}, "
                f"policy={pol}{extra})")
    if draft.kind == "full-model":
        return f"speculative=full-model (draft_model={draft.draft_model}, block_size={draft.block_size})"
    if draft.kind == "suffix":
        return (f"speculative=suffix (max_draft={draft.block_size}, policy=cost, "
                f"cache_tokens={draft.suffix_cache_tokens}, store={draft.suffix_store or 'none'})")
    if draft.kind == "mtp":
        head = f"draft_model={draft.draft_model}" if draft.draft_model else "head=target checkpoint"
        return (f"speculative=mtp ({head}, block_size={draft.block_size}, "
                f"{'explicit' if draft.block_explicit else 'default'})")
    return "speculative=off"
