"""One completion from a prompt to stdout: shared by `generate -p` and `run -p`."""

from __future__ import annotations

import sys
import time
from typing import Any

from ..drafters import registry
from ..engine.context_shift import ContextShift, configured
from ..engine.text import TextStream
from ..errors import MlxcelError, UsageError
from ..formats.prompting import beyond_any_tokenization, longest_token_chars, prompt_ids
from ..options import RunConfig
from ..session import Session, describe_draft, open_session, resolved_drafter_line
from ..terminal import ui
from ._input import clean, read_images, vision_of
from ._report import print_profile, summary_lines

STDIN_LIMIT = 16 * 2**20  # characters of a prompt read from stdin (a 50 MB pipe was read whole)


def read_prompt(prompt: str) -> str:
    if prompt == "-":
        if sys.stdin is None or sys.stdin.closed:
            raise UsageError("-p -: no standard input to read the prompt from")
        text = sys.stdin.read(STDIN_LIMIT + 1)
        if len(text) > STDIN_LIMIT:
            raise UsageError(
                f"-p -: standard input holds more than {STDIN_LIMIT} characters (the limit); "
                "no model's context window holds that much"
            )
        if not text.strip():
            raise UsageError("-p -: standard input was empty; pipe the prompt in (cat file | mlxcel generate -p -)")
        return clean(text, "-p - (standard input)", ui.warn)
    if not prompt.strip():
        raise UsageError("-p/--prompt is empty; pass the prompt text, or '-' to read it from stdin")
    return clean(prompt, "-p", ui.warn)


def shift_for(run: RunConfig, ids: list[int], tok: Any) -> ContextShift | None:
    """--context-shift: a generation that fills the window drops part of it and goes on
    (llama-cli's), keeping --keep prompt tokens; None: it stops at the window."""
    srv = run.options.server
    return configured(srv.keep, ids, getattr(tok, "bos_token_id", None)) if srv.context_shift else None


def run_oneshot(run: RunConfig, world: Any = None) -> None:
    opts = run.options
    g = opts.generation
    text = read_prompt(g.prompt or "")
    images = read_images(g.images)  # refused before any model loads
    session = open_session(run, say=ui.info if (g.verbose or g.profile) else _say_model_only, warn=ui.warn, world=world)
    tok = session.tokenizer
    eng = session.engine
    chars = len(text) + len(g.system or "")
    if beyond_any_tokenization(chars, eng.context_length, longest_token_chars(tok)):
        raise MlxcelError(
            f"the prompt has {chars} characters, more than the model's context window ({eng.context_length} "
            "tokens) can hold in any tokenization; shorten the prompt"
        )
    if images:
        vision = vision_of(session)
        ids = vision.prompt_ids(tok, text, images, system=g.system, chat_template=g.chat_template)
    else:
        ids = prompt_ids(tok, text, system=g.system, chat_template=g.chat_template)
    if len(ids) >= eng.context_length:
        raise MlxcelError(
            f"the prompt has {len(ids)} tokens, which fills the model's context window "
            f"({eng.context_length}); shorten the prompt"
        )
    draft = eng.draft  # as resolved at load (an MTP checkpoint's kind and width)
    warm = eng.warmup(ids, sampling=opts.sampling, calibrate=registry.calibrates(draft))
    if g.verbose or g.profile:
        if (resolved := resolved_drafter_line(draft)) is not None:
            ui.info(resolved)
        ui.info(describe_draft(draft) + f"; warmup {warm * 1000:.0f} ms")
    gen = eng.generate(
        ids,
        max_tokens=g.max_tokens,
        sampling=opts.sampling,
        min_tokens=g.min_tokens,
        ignore_eos=g.ignore_eos,
        constraint=_constraint(session, run),
        context_shift=shift_for(run, ids, tok),
    )
    gen.stats.warmup_s = warm
    stream = TextStream(gen, tok, g.stop)
    start = time.perf_counter()
    last = ""
    try:
        for piece in stream:
            ui.write_out(piece.text)
            last = piece.text or last
    except BaseException:  # Ctrl-C: the suffix store still keeps what was generated
        stream.generation.close()
        _save_store(session, verbose=g.verbose or g.profile)
        raise
    stream.generation.close()
    if not last.endswith("\n"):
        ui.write_out("\n")
    _save_store(session, verbose=g.verbose or g.profile)
    elapsed = time.perf_counter() - start
    st = gen.stats
    if g.profile:
        print_profile(st, session, finish_reason=stream.finish_reason)
    for line in summary_lines(st, elapsed, profile=g.profile):
        ui.info(line)
    if g.verify_exact and draft.enabled:
        _verify_exact(session, ids, gen.tokens, run)


def _save_store(session: Session, *, verbose: bool) -> None:
    said = session.save_store()
    if said and verbose:
        ui.info(said)


def _say_model_only(line: str) -> None:
    if line.startswith("model: default model"):
        ui.info(line)


def _constraint(session: Session, run: RunConfig):
    """The grammar the output follows (--grammar, --json-schema), compiled for this tokenizer."""
    if run.grammar is None:
        return None
    from ..engine.grammar import GrammarError, TokenizerIndex

    eng = session.engine
    try:
        return TokenizerIndex.of(session.tokenizer, eng.vocab_size, eng.eos_ids).compile(run.grammar)
    except GrammarError as exc:
        raise MlxcelError(str(exc)) from None


def _verify_exact(session: Session, ids: list[int], spec_tokens: list[int], run: RunConfig) -> None:
    from ..engine.exactness import first_divergence

    g = run.options.generation
    plain = session.engine.generate(
        ids,
        max_tokens=len(spec_tokens) if spec_tokens else g.max_tokens,
        sampling=run.options.sampling,
        min_tokens=g.min_tokens,
        ignore_eos=g.ignore_eos,
        speculative=False,
        constraint=_constraint(session, run),
        context_shift=shift_for(run, ids, session.tokenizer),
    )
    plain_tokens = [e.token for e in plain]
    report = first_divergence(session.engine.model, ids, spec_tokens, plain_tokens)
    if report is None:
        ui.info(f"[verify-exact] speculative output equals plain output ({len(spec_tokens)} tokens)")
    else:
        ui.warn(report.describe(session.tokenizer))
