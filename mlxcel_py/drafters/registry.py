"""Every drafter kind in one table: what validation, the startup lines, the policies and the
loader need to know of each, so that a kind is one row here plus one module beside this one.

Pure (no MLX): `validate` reads the table before anything heavy is imported. A row's `module`
(drafters/<module>.py) does the rest, through three functions the loader calls in order:
`prepare(draft, target, model_options)` checks the drafter against the target's files before any
weight loads and returns a `base.Plan` (it may hand over to another kind: an MTP checkpoint given
as --draft-model runs as mtp); `plan.load(target, say)` loads what the drafter needs once the
target's weights are in and returns the engine's `base.DrafterSource`; `Source(...)` builds that
source directly (tests, the bench, the Python API).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..options import DEFAULT_FULL_MODEL_BLOCK, DraftConfig

ADAPTIVE, FIXED = "adaptive", "fixed"
NONE, REQUIRED, OPTIONAL = "none", "required", "optional"


@dataclass(frozen=True, kw_only=True)
class DrafterKind:
    name: str  # --draft-kind
    # drafters/<module>.py builds it (a dotted path: a module anywhere); None: recognised, not available yet
    module: str | None
    # ADAPTIVE: a policy sizes every round up to lookup.max_draft (graded, gated, cost);
    # FIXED: block_size tokens every round (model drafters: their forward is the cost)
    sizing: str
    default_width: int  # proposal width when neither a flag nor a checkpoint sets one
    checkpoint: str  # whether --draft-model names its weights: NONE, REQUIRED or OPTIONAL
    loads_weights: bool  # a model drafter: its own weights load beside the target's
    help: str  # what --draft-kind's help says of it
    width_help: str  # what --draft-block-size's help says of its width
    parallel: tuple[str, ...] = ()  # the layouts it runs under: "tp" (--tp-size), "pp" (--pp-size)
    width_flag: str = "--draft-block-size"  # the flag that sets its width (bench recommends it)
    # whether a folder's config.json is this kind's checkpoint: given as a plain --draft-model it
    # runs as this kind; as -m, or as --draft-model under another --draft-kind, it is refused
    detect: Callable[[dict], bool] | None = None
    what: str = ""  # what a detected folder is, in those refusals ({model_type}: its config's)
    spec_type: str | None = None  # llama-server's --spec-type value for it
    unsharded: str = ""  # what stays in one process, for the refusal under --tp-size/--pp-size
    flag: str = ""  # the flag a refusal names (default --draft-kind NAME)
    default_policy: str = "auto"  # ADAPTIVE kinds: the policy unless --prompt-lookup-policy says
    # FIXED kinds: pause while the drafts do not pay (engine.policy.BreakEvenPolicy), for drafters
    # whose worth depends on the text; else every round drafts block_size tokens
    gated: bool = False
    # the block's first row is the last committed token (DFlash): block_size - 1 drafts a round
    anchored: bool = False
    # reads the target's hidden states or head, not only token ids (so not beside a vision model)
    reads_target: bool = False

    @property
    def named(self) -> str:
        return self.flag or f"--draft-kind {self.name}"

    @property
    def detected(self) -> bool:
        return self.detect is not None

    def describe(self, cfg: dict) -> str:
        """What a folder with this config is, for a refusal ("an MTP head (qwen3_5_mtp)")."""
        return self.what.format(model_type=cfg.get("model_type"))

    def runtime(self) -> ModuleType:
        if self.module is None:
            raise RuntimeError(f"no drafter module for kind {self.name!r}")
        if "." in self.module:  # a kind defined outside this package
            return importlib.import_module(self.module)
        return importlib.import_module(f"{__package__}.{self.module}")

    def prepare(self, draft: DraftConfig, target: Any, model_options: Any):
        """Config-level checks against the resolved target, before any weight loads: a base.Plan."""
        return self.runtime().prepare(draft, target, model_options)

    def source(self, draft: DraftConfig, *, model: Any, eos_ids: Any, vocab_size: int | None, assets: Any = None):
        """The engine's DrafterSource from what is loaded already (`assets`: a draft model, an
        MTP head, a suffix store)."""
        return self.runtime().Source(draft, model=model, eos_ids=eos_ids, vocab_size=vocab_size, assets=assets)


# ---- the checkpoint folders kinds recognise, from config.json alone ------------------------------
MTP_CHECKPOINT_TYPES = ("qwen3_5_mtp", "qwen3_next_mtp", "gemma4_assistant")


def is_mtp_checkpoint(cfg: dict) -> bool:
    """A head-only checkpoint (Qwen3.5 / Qwen3-Next MTP, a Gemma 4 assistant)."""
    return cfg.get("model_type") in MTP_CHECKPOINT_TYPES


def is_dflash_checkpoint(cfg: dict) -> bool:
    """Structural, as mlxcel checks it: a dflash_config block or a DFlash architecture."""
    return "dflash_config" in cfg or any("dflash" in str(a).lower() for a in cfg.get("architectures") or [])


def is_eagle3_checkpoint(cfg: dict) -> bool:
    """An EAGLE-3 checkpoint: an Eagle3 architecture or vLLM speculators' eagle3 algorithm."""
    archs = " ".join(str(a) for a in cfg.get("architectures") or []).lower()
    spec = cfg.get("speculators_config") if isinstance(cfg.get("speculators_config"), dict) else {}
    return "eagle3" in archs or cfg.get("speculators_model_type") == "eagle3" or spec.get("algorithm") == "eagle3"


KINDS: dict[str, DrafterKind] = {
    k.name: k
    for k in (
        DrafterKind(
            name="full-model",
            module="full_model",
            sizing=FIXED,
            default_width=DEFAULT_FULL_MODEL_BLOCK,
            checkpoint=REQUIRED,
            loads_weights=True,
            help="a smaller model of the target's family as --draft-model",
            width_help=f"full-model default {DEFAULT_FULL_MODEL_BLOCK}",
            spec_type="draft-simple",
            unsharded="drafter",
            flag="--draft-model",
        ),
        # the CLI's --prompt-lookup flags configure this kind too; --draft-kind prompt-lookup is serve's
        DrafterKind(
            name="prompt-lookup",
            module="prompt_lookup",
            sizing=ADAPTIVE,
            default_width=7,
            checkpoint=NONE,
            loads_weights=False,
            help="serve: n-grams of each request's own context",
            width_help="serve prompt lookup default 7",
            parallel=("tp",),
            width_flag="--prompt-lookup-max-draft",
        ),
        DrafterKind(
            name="mtp",
            module="mtp",
            sizing=FIXED,
            default_width=4,
            checkpoint=OPTIONAL,
            loads_weights=True,
            help="the checkpoint's own head: Qwen3.5, Qwen3-Next; a Gemma 4 assistant",
            width_help="mtp: the head checkpoint's width, else 4",
            detect=is_mtp_checkpoint,
            what="an MTP head ({model_type})",
            spec_type="draft-mtp",
            unsharded="head",
            reads_target=True,
        ),
        DrafterKind(
            name="dflash",
            module="dflash",
            sizing=FIXED,
            default_width=16,  # block rows: the last committed token + 15 drafts
            checkpoint=REQUIRED,
            loads_weights=True,
            help="a DFlash block-diffusion drafter as --draft-model",
            width_help="dflash: block rows, the checkpoint's block_size, else 16",
            detect=is_dflash_checkpoint,
            what="a DFlash speculative drafter",
            spec_type="draft-dflash",
            unsharded="drafter",
            anchored=True,
            reads_target=True,
        ),
        DrafterKind(
            name="eagle3",
            module="eagle3",
            sizing=FIXED,
            default_width=4,  # autoregressive drafts a round, when the checkpoint declares none
            checkpoint=REQUIRED,
            loads_weights=True,
            help="an EAGLE-3 feature drafter as --draft-model",
            width_help="eagle3: its num_speculative_tokens, else 4",
            detect=is_eagle3_checkpoint,
            what="an EAGLE-3 speculative drafter",
            spec_type="draft-eagle3",
            unsharded="drafter",
            gated=True,  # trained here or published, its acceptance varies with the text
            reads_target=True,
        ),
        DrafterKind(
            name="suffix",
            module="suffix",
            sizing=ADAPTIVE,
            default_width=16,
            checkpoint=NONE,
            loads_weights=False,
            help="SuffixDecoding: the context and earlier sequences",
            width_help="suffix at most 16",
            parallel=("tp",),
            default_policy="cost",
        ),
    )
}


def kind_help() -> str:
    """--draft-kind's help: every kind and what it drafts from."""
    kinds = " | ".join(f"{k.name} ({k.help})" for k in KINDS.values())
    return f"Drafter: {kinds}; a detected checkpoint given as --draft-model runs as its kind."


def width_help() -> str:
    """--draft-block-size's help: each kind's default width."""
    return f"Proposal width ({'; '.join(k.width_help for k in KINDS.values())})."


def kind_of(name: str | None) -> DrafterKind:
    try:
        return KINDS[name or ""]
    except KeyError:
        raise ValueError(f"no drafter kind {name!r}") from None


def detected_kind(cfg: dict) -> DrafterKind | None:
    """The kind whose checkpoint a folder's config is (None: a standalone model)."""
    return next((k for k in KINDS.values() if k.detect is not None and k.detect(cfg)), None)


def by_spec_type(value: str) -> DrafterKind | None:
    return next((k for k in KINDS.values() if k.spec_type == value), None)


# ---- what a configured drafter runs as --------------------------------------------------------
def width(draft: DraftConfig) -> int:
    """The widest proposal a round can make (warmup runs every verify width up to one more)."""
    if not draft.enabled:
        return 0
    if draft.lookup_first:
        return max(draft.lookup.max_draft, model_width(draft))
    return model_width(draft)


def model_width(draft: DraftConfig) -> int:
    """The kind's own widest proposal (a composite's model drafter: at most this a round)."""
    kind = kind_of(draft.kind)
    if kind.sizing == ADAPTIVE:
        return draft.lookup.max_draft
    return draft.block_size - 1 if kind.anchored else draft.block_size


def calibrates(draft: DraftConfig) -> bool:
    """Warmup times every verify width: the cost policy sizes this drafter's proposals from them,
    and a composite's model side drafts only while a verify of its width pays (a verify row costs
    0.07 of a plain step on AVX-512 and 0.3-0.4 on AVX2: no default fits both)."""
    return draft.enabled and (
        draft.lookup_first
        or (kind_of(draft.kind).sizing == ADAPTIVE and draft.lookup.adaptive and draft.lookup.policy == "cost")
    )


def with_width(draft: DraftConfig, w: int) -> DraftConfig:
    """The same drafter at another proposal width (bench --sweep-widths)."""
    from dataclasses import replace

    if kind_of(draft.kind).sizing == ADAPTIVE:  # the policy reads lookup.max_draft (suffix: block_size too)
        return replace(
            draft,
            lookup=replace(draft.lookup, max_draft=w),
            block_size=w if draft.kind != "prompt-lookup" else draft.block_size,
        )
    return replace(draft, block_size=w + 1 if kind_of(draft.kind).anchored else w)


def policy_name(draft: DraftConfig, *, on_cuda: bool) -> str:
    """The policy a round loop runs with (auto resolved)."""
    kind = kind_of(draft.kind)
    if kind.sizing == FIXED and not draft.lookup_first:
        return "break-even" if kind.gated else "fixed"
    if not draft.lookup.adaptive:
        return "fixed"
    if draft.lookup.policy == "auto":
        return "gated" if on_cuda else "graded"
    return draft.lookup.policy


def describe(draft: DraftConfig, *, on_cuda: bool = False, shadow: int = 0, max_batch: int | str | None = None) -> str:
    """The startup `speculative=...` line, with the policy as it will run (`shadow`: the gated
    policy's shadow confirmation length; `max_batch`: serve's gate, which mlxcel's server line for
    prompt lookup shows)."""
    if not draft.enabled:
        return "speculative=off"
    if draft.lookup_first:
        from dataclasses import replace

        lk = draft.lookup
        model = describe(replace(draft, lookup_first=False, tree_budget=0)).removeprefix("speculative=")
        return (
            f"speculative=prompt-lookup+{draft.kind} (prompt lookup where the context has a match: max_draft="
            f"{lk.max_draft}, ngram={lk.ngram_min}..{lk.ngram_max}, policy={policy_name(draft, on_cuda=on_cuda)}; "
            f"elsewhere {model}{describe_tree(draft)})"
        )
    if draft.kind == "prompt-lookup":
        lk = draft.lookup
        pol = policy_name(draft, on_cuda=on_cuda)
        extra = f", shadow_confirm_tokens={shadow}" if pol == "gated" else ""
        extra += f", max_batch={max_batch}" if max_batch is not None else ""
        return (
            f"speculative=prompt-lookup (max_draft={lk.max_draft}, ngram={lk.ngram_min}..{lk.ngram_max}, "
            f"policy={pol}{extra}{describe_tree(draft)})"
        )
    if draft.kind == "full-model":
        return (
            f"speculative=full-model (draft_model={draft.draft_model}, block_size={draft.block_size}"
            f"{describe_tree(draft)})"
        )
    if draft.kind == "suffix":
        return (
            f"speculative=suffix (max_draft={draft.block_size}, policy=cost, "
            f"cache_tokens={draft.suffix_cache_tokens}, store={draft.suffix_store or 'none'}{describe_tree(draft)})"
        )
    head = f"draft_model={draft.draft_model}" if draft.draft_model else "head=target checkpoint"
    return (
        f"speculative={draft.kind} ({head}, block_size={draft.block_size}, "
        f"{'explicit' if draft.block_explicit else 'default'}{describe_tree(draft)})"
    )


def resolved_line(draft: DraftConfig) -> str | None:
    """mlxcel's line for model drafters: which kind runs, at which width, and where it came from."""
    if not draft.enabled or not kind_of(draft.kind).loads_weights:
        return None
    return (
        f"Resolved drafter kind: {draft.kind} (block_size = {draft.block_size}, "
        f"{'explicit' if draft.block_explicit else 'default'})"
    )


def label(draft: DraftConfig) -> str:
    """A configuration's short name in benchmark tables."""
    tree = f" tree={draft.tree_budget}" if draft.tree_budget else ""
    if draft.kind == "prompt-lookup":
        return f"prompt-lookup k={draft.lookup.max_draft}{tree}"
    if draft.lookup_first:
        return f"prompt-lookup+{draft.kind} k={draft.lookup.max_draft}/{model_width(draft)}{tree}"
    return f"{draft.kind} k={width(draft)}{tree}"  # k: tokens proposed a round (a DFlash block is one wider)


def describe_tree(draft: DraftConfig) -> str:
    """What the startup line adds for a draft tree (engine/tree.py), or nothing."""
    if not draft.tree_budget:
        return ""
    margin = f", margin={draft.tree_margin:g}" if draft.tree_margin != float("inf") else ""
    return f", tree={draft.tree_budget} nodes{margin}"
