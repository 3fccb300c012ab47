"""The terminal chat's presentation, beside ui.py: banner, command replies, notes, turn stats.

`commands/_repl.py` decides what a chat does; this module says it. Everything here goes to
stderr (replies themselves go to stdout through `ui.write_out`), so `mlxcel chat > file` keeps
only the model's words.
"""

from __future__ import annotations

from typing import Any

from .ui import err, info

HELP = """Commands:
  /help, /?   show this help
  /clear      forget the conversation
  /image FILE attach an image to your next message (vision-language models)
  /bye        exit (Ctrl-D too)
  \"\"\"         start or end a multi-line message
Ctrl-C cancels a reply that is streaming; the conversation is kept."""


def banner(drafter: str) -> None:
    err().print(f"mlxcel chat: {drafter}. Type /help for commands.", style="ui.accent", markup=False)


def reading_piped() -> None:
    info("(non-interactive stdin detected: reading messages until EOF)")


def show_help() -> None:
    err().print(HELP, markup=False)


def cleared() -> None:
    err().print("Conversation cleared.", style="ui.muted")


def unknown_command(cmd: str) -> None:
    err().print(f"Unknown command: {cmd}. Type /? for the list of commands.", style="ui.warn", markup=False)


def image_attached(path: str, count: int) -> None:
    more = f" ({count} images)" if count > 1 else ""
    err().print(f"Attached {path} to your next message{more}.", style="ui.muted", markup=False)


def turns_dropped(count: int, window: int) -> None:
    err().print(
        f"(the {count} oldest messages no longer fit the context window of {window} tokens and were dropped)",
        style="ui.muted",
        markup=False,
    )


def turn_refused(message: str) -> None:
    """A turn that could not run (a bad image, a refused prompt): the conversation is kept."""
    err().print(f"error: {message} (the conversation is kept)", style="ui.warn", markup=False)


def exit_hint() -> None:
    err().print("\n(use /bye or Ctrl-D to exit)", style="ui.muted")


def reply_cancelled() -> None:
    err().print("(reply cancelled; the conversation is kept)", style="ui.muted")


def turn_stats(st: Any) -> None:
    """`--profile` in chat: one line per reply."""
    spec = (
        f", {st.draft_kind}: {st.drafted_rounds} drafted rounds, {st.accepted}/{st.proposed} accepted"
        if st.draft_kind
        else ""
    )
    info(f"[{st.generated_tokens} tokens, {st.decode_tps:.1f} tok/s, {st.cached_tokens} prompt tokens reused{spec}]")


def bye() -> None:
    err().print("Bye!", style="ui.muted")
