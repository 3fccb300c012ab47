"""Interactive chat: streaming replies, /help, /clear, /bye, \"\"\" blocks, Ctrl-C, prompt-cache reuse.

History is a list of messages re-rendered through the chat template each turn; the engine keeps
the KV cache of the previous turn and reuses its longest common prefix. Ctrl-C while a reply
streams cancels that reply only: earlier turns, and the user's message, stay in the history.
Piped stdin reads one message per line until EOF and writes only replies to stdout.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from ..engine.text import TextStream
from ..errors import MlxcelError, UsageError
from ..options import RunConfig
from ..session import describe_draft, open_session
from ..terminal import chat_view, ui
from ._input import clean, conversation_ids, read_images, vision_of, with_images
from ._oneshot import shift_for


def _lines(interactive: bool) -> Iterator[str]:
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
        while True:
            try:
                yield input(">>> ")
            except KeyboardInterrupt:
                chat_view.exit_hint()
                continue
            except EOFError:
                return
    else:
        for line in sys.stdin:
            yield line.rstrip("\n")


def read_messages(lines: Iterator[str], interactive: bool) -> Iterator[str]:
    """Group raw lines into messages: one line each, or a \"\"\" ... \"\"\" block."""
    for line in lines:
        stripped = line.strip()
        if stripped.startswith('"""'):
            body = stripped[3:]
            if body.endswith('"""') and len(body) >= 3:
                yield body[:-3]
                continue
            parts = [body] if body else []
            for more in lines:
                if more.rstrip().endswith('"""'):
                    parts.append(more.rstrip()[:-3])
                    break
                parts.append(more)
            yield "\n".join(parts)
            continue
        yield line


def run_chat(run: RunConfig, world: Any = None) -> None:
    opts = run.options
    g = opts.generation
    interactive = sys.stdin.isatty()
    session = open_session(run, say=ui.info, warn=ui.warn, world=world)
    eng = session.engine
    eng.warmup(sampling=opts.sampling)
    if interactive:
        chat_view.banner(describe_draft(eng.draft))
    else:
        chat_view.reading_piped()
    pending = [g.prompt] if g.prompt else []
    messages = read_messages(_lines(interactive), interactive)
    try:
        _converse(session, run, pending, messages, interactive)
    finally:
        said = session.save_store()  # what the suffix drafter learned, kept for the next run
        if said:
            ui.info(said)
    if interactive:
        chat_view.bye()


def _converse(session, run: RunConfig, pending: list, messages, interactive: bool) -> None:
    """Turns until EOF or /bye; a failed or cancelled reply keeps the conversation."""
    opts = run.options
    g = opts.generation
    tok, eng = session.tokenizer, session.engine
    base = [{"role": "system", "content": g.system}] if g.system else []
    history: list[dict] = list(base)
    attached: list = []  # /image's images, for the next message
    while True:
        if pending:
            msg = pending.pop(0)
        else:
            try:
                msg = next(messages)
            except StopIteration:
                break
        msg = clean(msg, "this message", ui.warn)
        text = msg.strip()
        if not text:
            continue
        if text.startswith("/") and "\n" not in text:
            cmd = text.split()[0]
            if cmd == "/bye":
                break
            if cmd == "/clear":
                history, attached = list(base), []
                chat_view.cleared()
                continue
            if cmd in ("/help", "/?"):
                chat_view.show_help()
                continue
            if cmd == "/image":
                _attach(session, text[len(cmd) :].strip(), attached)
                continue
            chat_view.unknown_command(cmd)
            continue
        history.append({"role": "user", "content": with_images(attached, msg)})
        try:
            ids = _fitted(session, history, len(base), g)
        except MlxcelError as exc:  # a bad image, a message over the window: the turn goes, the rest stays
            history.pop()
            chat_view.turn_refused(exc.message)
            continue
        attached = []
        gen = eng.generate(
            ids,
            max_tokens=g.max_tokens,
            sampling=opts.sampling,
            min_tokens=g.min_tokens,
            ignore_eos=g.ignore_eos,
            reuse_cache=True,
            context_shift=shift_for(run, ids, tok),
        )
        stream = TextStream(gen, tok, g.stop)
        try:
            for piece in stream:
                ui.write_out(piece.text)
        except KeyboardInterrupt:
            stream.generation.close()
            ui.write_out("\n")
            chat_view.reply_cancelled()
        history.append({"role": "assistant", "content": stream.text})
        ui.write_out("\n\n" if interactive else "\n")
        if g.profile:
            chat_view.turn_stats(gen.stats)


def _attach(session, path: str, attached: list) -> None:
    """/image FILE: checked now (a bad file is one line, and the chat goes on)."""
    try:
        if not path:
            raise UsageError("/image needs a file: /image photo.png")
        vision_of(session, "/image")
        attached.append(read_images([path], "/image")[0])
    except MlxcelError as exc:
        chat_view.turn_refused(exc.message)
        return
    chat_view.image_attached(path, len(attached))


def _fitted(session, history: list, head: int, g) -> list[int]:
    """The conversation's ids, leaving room in the window for a reply: while it does not, the
    oldest exchange (a user turn and its reply, after the system turn) is dropped from the
    history, as llama-cli's chat lets old turns go (a long chat used to get empty replies once
    its history passed the window). A message that alone leaves no room is refused."""
    window = session.engine.context_length
    reserve = min(g.max_tokens, window // 2) if g.max_tokens > 0 else window // 4
    dropped = 0
    while True:
        ids = conversation_ids(session, history, g.chat_template)
        if len(ids) + reserve <= window or len(history) - head <= 1:
            break
        del history[head : head + 2]
        dropped += 2
    if dropped:
        chat_view.turns_dropped(dropped, window)
    if len(ids) >= window:
        raise UsageError(
            f"this message takes {len(ids)} tokens with the system prompt, which fills the context window "
            f"({window}); shorten it"
        )
    return ids
