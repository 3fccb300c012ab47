"""Interactive chat: streaming replies, /help, /clear, /bye, \"\"\" blocks, Ctrl-C, prompt-cache reuse.

History is a list of messages re-rendered through the chat template each turn; the engine keeps
the KV cache of the previous turn and reuses its longest common prefix. Ctrl-C while a reply
streams cancels that reply only: earlier turns, and the user's message, stay in the history.
Piped stdin reads one message per line until EOF and writes only replies to stdout.
"""

from __future__ import annotations

import sys
from typing import Iterator

from .. import ui
from ..options import RunConfig
from ..prompting import render_messages
from ..session import describe_draft, open_session
from ..text import TextStream

HELP = """Commands:
  /help, /?   show this help
  /clear      forget the conversation
  /bye        exit (Ctrl-D too)
  \"\"\"         start or end a multi-line message
Ctrl-C cancels a reply that is streaming; the conversation is kept."""


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
                ui.err().print("\n(use /bye or Ctrl-D to exit)", style="ui.muted")
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


def run_chat(run: RunConfig) -> None:
    opts = run.options
    g = opts.generation
    interactive = sys.stdin.isatty()
    session = open_session(run, say=ui.info, warn=ui.warn)
    eng = session.engine
    eng.warmup(sampling=opts.sampling)
    if interactive:
        ui.err().print(f"mlxcel chat: {describe_draft(eng.draft)}. Type /help for commands.", style="ui.accent")
    else:
        ui.info("(non-interactive stdin detected: reading messages until EOF)")
    pending = [g.prompt] if g.prompt else []
    messages = read_messages(_lines(interactive), interactive)
    try:
        _converse(session, run, pending, messages, interactive)
    finally:
        said = session.save_store()  # what the suffix drafter learned, kept for the next run
        if said:
            ui.info(said)
    if interactive:
        ui.err().print("Bye!", style="ui.muted")


def _converse(session, run: RunConfig, pending: list, messages, interactive: bool) -> None:
    """Turns until EOF or /bye; a failed or cancelled reply keeps the conversation."""
    opts = run.options
    g = opts.generation
    tok, eng = session.tokenizer, session.engine
    base = [{"role": "system", "content": g.system}] if g.system else []
    history: list[dict] = list(base)
    while True:
        if pending:
            msg = pending.pop(0)
        else:
            try:
                msg = next(messages)
            except StopIteration:
                break
        text = msg.strip()
        if not text:
            continue
        if text.startswith("/") and "\n" not in text:
            cmd = text.split()[0]
            if cmd == "/bye":
                break
            if cmd == "/clear":
                history = list(base)
                ui.err().print("Conversation cleared.", style="ui.muted")
                continue
            if cmd in ("/help", "/?"):
                ui.err().print(HELP, markup=False)
                continue
            ui.err().print(f"Unknown command: {cmd}. Type /? for the list of commands.", style="ui.warn", markup=False)
            continue
        history.append({"role": "user", "content": msg})
        ids = render_messages(tok, history, chat_template=g.chat_template)
        gen = eng.generate(ids, max_tokens=g.max_tokens, sampling=opts.sampling, min_tokens=g.min_tokens,
                           ignore_eos=g.ignore_eos, reuse_cache=True)
        stream = TextStream(gen, tok, g.stop)
        try:
            for piece in stream:
                ui.write_out(piece.text)
        except KeyboardInterrupt:
            stream.generation.close()
            ui.write_out("\n")
            ui.err().print("(reply cancelled; the conversation is kept)", style="ui.muted")
        history.append({"role": "assistant", "content": stream.text})
        ui.write_out("\n\n" if interactive else "\n")
        if g.profile:
            st = gen.stats
            spec = (f", {st.draft_kind}: {st.drafted_rounds} drafted rounds, {st.accepted}/{st.proposed} accepted"
                    if st.draft_kind else "")
            ui.info(f"[{st.generated_tokens} tokens, {st.decode_tps:.1f} tok/s, {st.cached_tokens} prompt tokens reused{spec}]")
