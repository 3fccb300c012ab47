"""The Python API: the engine the CLI runs, to script.

    import mlxcel_py as mc
    model = mc.load()                                    # the default model; mc.load("dir|repo|file.gguf", draft=...)
    text = mc.generate(model, "Fix the typos: teh cat", max_tokens=64, prompt_lookup=True)
    for piece in mc.stream(model, "Hello", max_tokens=32): ...
    gen = mc.speculative_generate(model, model.encode("Hello"), mc.GenerateOptions(max_tokens=32),
                                  mc.PromptLookupDrafter(), mc.DraftPolicy.auto())
    tokens = list(gen); gen.stats(); gen.finish_reason

Every argument goes through the CLI's own validation (`validate.validate` on the same option
objects `mlxcel generate` builds), so a bad one raises the CLI's MlxcelError subclass with the
CLI's message, and loading and decoding are the CLI's too (`session.open_session`, `Engine`):
greedy output equals `mlxcel generate`'s and plain decoding's token for token, whatever the
drafter proposes. A user's drafter subclasses `Drafter` (drafters/base.py) and implements
`draft(context, k)`; a proposal of garbage costs speed only.

Here: loading (`Model`, `load`) and the calls; what a call asks for is `options`
(`GenerateOptions`, `DraftPolicy`), what it returns `results` (`Generation`, `Stats`, `StreamPiece`).
"""

from __future__ import annotations

from ..cpu import blas

blas.prepare()  # before anything below imports mlx.core (cpu/blas.py says why)

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from ..drafters import composite, registry
from ..drafters.base import Drafter
from ..engine.text import TextStream
from ..errors import MlxcelError, UsageError
from ..formats.prompting import prompt_ids
from ..options import (
    DEFAULT_MAX_DRAFT,
    AdapterSpec,
    CommandOptions,
    ModelOptions,
    PromptLookupOptions,
    PromptOptions,
    RunConfig,
    SamplingOptions,
    SpecOptions,
)
from ..session import Session, open_session
from ..validate import validate
from .options import DEFAULT_API_MAX_TOKENS, DraftPolicy, GenerateOptions
from .results import Generation, Stats, StreamPiece, _pieces


class Model:
    """A loaded target model, and the drafter `load()` was asked for (if any)."""

    def __init__(self, session: Session, run: RunConfig):
        self.session = session
        self._run = run
        self.engine = session.engine
        self.tokenizer = session.tokenizer
        self.model = self.engine.model  # the mlx-lm model (FullModelDrafter(mc.load(small).model))

    @property
    def drafter_kind(self) -> str | None:
        return self.engine.draft.kind

    def make_drafter(self) -> Drafter:
        """A new drafter of the kind `load()` configured (for speculative_generate)."""
        if self.engine.drafters is None:
            raise UsageError(
                "this model was loaded without a drafter; pass draft= or draft_kind= to mc.load(), "
                "or give speculative_generate a Drafter"
            )
        return self.engine.drafters.make(private=True)

    def encode(self, text: str, *, chat_template: bool = True, system: str | None = None) -> list[int]:
        """Prompt ids as `mlxcel generate -p TEXT` builds them (the chat template unless turned off)."""
        return prompt_ids(self.tokenizer, text, system=system, chat_template=chat_template)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def __repr__(self) -> str:
        return f"<mlxcel_py.Model {self.session.target.resolved.source.split(' (')[0]}, drafter {self.drafter_kind}>"


def load(
    model: str | None = None,
    *,
    draft: str | None = None,
    draft_kind: str | None = None,
    draft_block_size: int | None = None,
    revision: str | None = None,
    cpu_weights: str = "auto",
    cache_type_k: str = "auto",
    cache_type_v: str = "auto",
    suffix_cache_tokens: int | None = None,
    suffix_store: str | None = None,
    draft_tree_budget: int | None = None,
    draft_acceptance: str | None = None,
    adapter: str | None = None,
    adapters: Sequence[tuple[str, float]] = (),
    warmup: bool = True,
) -> Model:
    """Load a model as `mlxcel generate -m MODEL` does: a folder, a .gguf file, an owner/name repo id
    in the local Hugging Face cache, or None for the default model. `draft`: a drafter checkpoint
    (a small LM, an MTP head); `draft_kind`: mtp, dflash, suffix or full-model (prompt lookup needs no load:
    pass prompt_lookup=True per call). `draft_tree_budget`: the drafter's rounds verify draft trees
    of up to that many more nodes (--draft-tree-budget; greedy calls only, sampled calls verify
    chains). `cache_type_k` / `cache_type_v`: the KV cache type (--cache-type-k/-v: auto, f32,
    f16, bf16, q8_0). `draft_acceptance`: how sampled calls judge a model drafter's drafts
    (--draft-acceptance: sampler-match, the default, gives plain sampling's tokens under a seed; or
    p-q). `adapter`: an mlx-lm adapter folder fused into the weights
    (--adapter-path); `adapters`: (path, scale) pairs of GGUF LoRA files or folders fused beside it
    (--lora-scaled). Refusals are the CLI's, as MlxcelError subclasses."""
    opts = CommandOptions(
        command="generate",
        model=ModelOptions(
            model=model,
            revision=revision,
            draft_model=draft,
            cpu_weights=cpu_weights,
            cache_type_k=cache_type_k,
            cache_type_v=cache_type_v,
            adapters=((AdapterSpec(adapter, 1.0, "--adapter-path"),) if adapter else ())
            + tuple(AdapterSpec(str(p), float(w), "--lora-scaled") for p, w in adapters),
        ),
        # a one-shot prompt stands in for the calls to come (validation asks whether there is one)
        generation=PromptOptions(prompt=""),
        spec=SpecOptions(
            draft_kind=draft_kind,
            draft_block_size=draft_block_size,
            suffix_cache_tokens=suffix_cache_tokens,
            suffix_store=suffix_store,
            tree_budget=draft_tree_budget,
            draft_acceptance=draft_acceptance,
        ),
    )
    run = validate(opts)
    session = open_session(run)
    if warmup:  # every verify width a per-call prompt lookup may use, too
        session.engine.warmup(width=max(registry.width(session.engine.draft), DEFAULT_MAX_DRAFT))
    return Model(session, run)


def _request(model: Model, options: GenerateOptions, *, prompt_lookup: bool = False) -> RunConfig:
    """The CLI's validation of one call's options (the model's own drafter flags included)."""
    base = model._run.options
    g = options._params()
    opts = replace(
        base,
        generation=replace(
            base.generation,
            prompt="",
            max_tokens=g["max_tokens"],
            min_tokens=g["min_tokens"],
            stop=g["stop"],
            ignore_eos=g["ignore_eos"],
        ),
        sampling=SamplingOptions(
            temp=g["temp"],
            top_p=g["top_p"],
            top_k=g["top_k"],
            min_p=g["min_p"],
            seed=g["seed"],
            repetition_penalty=g["repetition_penalty"],
            repeat_last_n=g["repeat_last_n"],
        ),
        # a call's own flags: draft trees were checked at load, and a sampled call verifies chains
        spec=replace(base.spec, lookup=PromptLookupOptions(enabled=prompt_lookup), tree_budget=None),
    )
    return validate(opts)


def speculative_generate(
    model: Model,
    prompt: Sequence[int],
    options: GenerateOptions | None = None,
    drafter: Drafter | None = None,
    policy: DraftPolicy | None = None,
) -> Generation:
    """Token ids after `prompt` (ids), speculating with `drafter` (default: the model's own drafter,
    else plain decoding) under `policy` (default DraftPolicy.auto())."""
    options = options or GenerateOptions()
    run = _request(model, options)
    eng = model.engine
    prompt = list(prompt)
    if not prompt:
        raise UsageError("the prompt is empty; pass at least one token id")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < (eng.vocab_size or 1 << 62) for t in prompt):
        raise UsageError(f"prompt token ids must be integers in 0..{(eng.vocab_size or 1 << 62) - 1}")
    _check_room(eng, prompt)
    if drafter is not None:  # the caller's
        pol = (policy or DraftPolicy.auto())._make(getattr(drafter, "kind", "custom"), eng.verify_cost)
    elif eng.drafters is not None:  # the model's own
        drafter, pol = _own_drafting(eng)
        if policy is not None:
            pol = policy._make(drafter.kind, eng.verify_cost)
    else:
        pol = None  # plain decoding
    return Generation(_start(model, run, prompt, drafter, pol))


def _lookup_drafting(model: Model, run: RunConfig) -> tuple[Drafter, Any]:
    """prompt_lookup=True: prompt lookup alone, or beside the model's own drafter the composite
    drafter `--draft-model D --prompt-lookup` runs (that drafter's loaded weights, shared)."""
    eng = model.engine
    if run.draft.lookup_first and eng.drafters is not None:
        src = composite.Source(eng.drafters.retarget(run.draft, model.session.target))
    else:
        src = registry.kind_of(run.draft.kind).source(
            run.draft, model=eng.model, eos_ids=eng.eos_ids, vocab_size=eng.vocab_size
        )
    return src.make(), src.make_policy(eng.verify_cost)


def _own_drafting(eng: Any) -> tuple[Drafter, Any]:
    """The model's drafter (shared across calls, as across the CLI's requests) and its policy."""
    return eng.drafters.make(), eng.drafters.make_policy(eng.verify_cost)


def _check_room(eng: Any, ids: Sequence[int]) -> None:
    """The CLI's refusal of a prompt that leaves no room for a reply (a runtime error there too)."""
    if len(ids) >= eng.context_length:
        raise MlxcelError(
            f"the prompt has {len(ids)} tokens, which fills the model's context window "
            f"({eng.context_length}); shorten the prompt"
        )


def _start(model: Model, run: RunConfig, prompt: list[int], drafter: Any, policy: Any):
    """The engine's generation of one validated call (drafter None: plain decoding)."""
    g = run.options.generation
    return model.engine.generate(
        prompt,
        max_tokens=g.max_tokens,
        sampling=run.options.sampling,
        min_tokens=g.min_tokens,
        ignore_eos=g.ignore_eos,
        speculative=drafter is not None,
        drafter=drafter,
        policy=policy,
    )


def stream(
    model: Model,
    prompt: str,
    *,
    max_tokens: int = DEFAULT_API_MAX_TOKENS,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    seed: int | None = None,
    repetition_penalty: float = 1.0,
    repeat_last_n: int = -1,
    stop: Sequence[str] = (),
    prompt_lookup: bool = False,
    speculative: bool = True,
    chat_template: bool = True,
    system: str | None = None,
    min_tokens: int = 0,
    ignore_eos: bool = False,
) -> Iterator[StreamPiece]:
    """Pieces of the reply to `prompt`, as `mlxcel generate -p PROMPT` streams them to stdout
    (arguments are checked when it is called, before the first piece). Each is a `StreamPiece`: the
    text itself (a str), with its token ids, how many came from accepted drafts, the decoding speed
    so far and, on the last piece (whose text may be empty), the finish reason.
    prompt_lookup=True drafts from the prompt (the CLI's --prompt-lookup defaults); the model's own
    drafter runs unless speculative=False."""
    options = GenerateOptions(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        seed=seed,
        repetition_penalty=repetition_penalty,
        repeat_last_n=repeat_last_n,
        min_tokens=min_tokens,
        ignore_eos=ignore_eos,
        stop=stop,  # checked (a string or strings) with the rest in _request
    )
    run = _request(model, options, prompt_lookup=prompt_lookup)
    if not isinstance(prompt, str) or not prompt.strip():
        raise UsageError("the prompt is empty; pass the prompt text")
    ids = model.encode(prompt, chat_template=chat_template, system=system)
    eng = model.engine
    _check_room(eng, ids)
    drafter = policy = None
    if prompt_lookup:  # this call's drafter, as --prompt-lookup configures it
        drafter, policy = _lookup_drafting(model, run)
    elif speculative and eng.drafters is not None:
        drafter, policy = _own_drafting(eng)
    gen = _start(model, run, ids, drafter, policy)
    return _pieces(TextStream(gen, model.tokenizer, run.options.generation.stop))


def generate(model: Model, prompt: str, **kwargs: Any) -> str:
    """The whole reply to `prompt` (the arguments of `stream`)."""
    return "".join(p.text for p in stream(model, prompt, **kwargs))


__all__ = [
    "DraftPolicy",
    "Drafter",
    "GenerateOptions",
    "Generation",
    "Model",
    "Stats",
    "StreamPiece",
    "generate",
    "load",
    "speculative_generate",
    "stream",
]
