"""Tool calls as they stream: the text before a call goes out as it comes, a call's markup is held
until the reply ends (then parsed: tool_calls.parse), and under a grammar (`live_args`) each call's
id, name and argument fragments go out in OpenAI's pieces as they are decoded (`LiveArguments`)."""

from __future__ import annotations

import re
import uuid

from . import tool_formats
from .tool_calls import ToolCall, functions, parse

# how a reply that is a call begins (after whitespace): while its start could still be one of
# these (a JSON object too: Llama 3.x, the generic format), the text is held back; a call's
# markup may also follow some text (_OPENERS)
_OPENERS = tool_formats.OPENERS
_CALL_STARTS = tool_formats.CALL_STARTS
ARGUMENT_FRAGMENT = 24  # characters of a call's arguments per streamed delta
HEAD_REACH = 256  # characters a call's head ("name": ..., "arguments": ) can span


# where a call's arguments begin, in every JSON call format above: its name, then its arguments
_CALL_HEAD = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


class LiveArguments:
    """A constrained reply's calls as they are decoded: each call's id and name once its
    arguments begin, then the arguments text as it comes, until its object closes. Only under a
    grammar, which makes every call well-formed and its name one of the tools (so nothing sent
    has to be taken back); an arguments value that is not an object stops it (the rest of the
    calls then go out whole at the end)."""

    def __init__(self, names: set[str]):
        self.names = names
        self.text = ""
        self.pos = 0  # scanned up to here
        self.sent = 0  # calls whose arguments are complete
        self.open = False  # inside a call's arguments
        self.depth, self.in_str, self.esc = 0, False, False
        self.stopped = False

    def feed(self, text: str) -> list[dict]:
        """`delta.tool_calls` entries for what `text` adds."""
        self.text += text
        out: list[dict] = []
        while not self.stopped:
            if not self.open:
                m = _CALL_HEAD.search(self.text, self.pos)
                if m is None:
                    # a head is short (a name is at most 64 characters): later searches need not
                    # rescan what is far behind, so a long reply is not scanned once per piece
                    self.pos = max(self.pos, len(self.text) - HEAD_REACH)
                    break
                rest = self.text[m.end() :]
                if not rest:
                    break  # the value has not begun: wait
                name = tool_formats.json_or_none(f'"{m.group(1)}"')
                if name not in self.names or not rest.startswith("{"):
                    self.stopped = True
                    break
                out.append(
                    {
                        "index": self.sent,
                        "id": f"call_{uuid.uuid4().hex[:24]}",
                        "type": "function",
                        "function": {"name": name, "arguments": ""},
                    }
                )
                self.open, self.pos, self.depth = True, m.end(), 0
            end = self._scan()
            piece = self.text[self.pos : end if end is not None else len(self.text)]
            if piece:
                out.append({"index": self.sent, "function": {"arguments": piece}})
            if end is None:
                self.pos = len(self.text)
                break
            self.pos, self.open, self.sent = end, False, self.sent + 1
        return out

    def _scan(self) -> int | None:
        """Where the open arguments object ends (just past its brace), or None if not yet."""
        for i in range(self.pos, len(self.text)):
            c = self.text[i]
            if self.in_str:
                if self.esc:
                    self.esc = False
                elif c == "\\":
                    self.esc = True
                elif c == '"':
                    self.in_str = False
            elif c == '"':
                self.in_str = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
        return None


class ToolStream:
    """A streamed reply with tools offered: text that cannot be (part of) a call goes out as it
    comes; from the first sign of a call the rest is held, and parsed when the reply ends. Under
    a grammar (`live_args`) the calls themselves also go out as they are decoded (LiveArguments)."""

    def __init__(self, tools: list[dict], live_args: bool = False):
        self.tools = tools
        self.head = ""  # the reply's start, while it could still open a call
        self.live = False  # the start was plain text: stream, watching for a Hermes block
        self.held = ""  # from a call's first sign to the end
        self.args = LiveArguments({f["name"] for f in functions(tools)}) if live_args else None
        self.scanned = 0  # characters of `held` the scanner has seen

    def feed(self, text: str) -> tuple[str, list[dict]]:
        """(content to send now, `delta.tool_calls` entries to send now)."""
        content = self._content(text)
        if self.args is None or not self.held.lstrip().startswith(_CALL_STARTS):
            return content, []
        # from a call's first sign the held text only grows: the scanner gets what it has not seen
        fresh, self.scanned = self.held[self.scanned :], len(self.held)
        return content, self.args.feed(fresh)

    def _content(self, text: str) -> str:
        if self.held and not (self.live and not self.held.startswith(_OPENERS)):
            self.held += text  # a call has begun: the rest waits for the end
            return ""
        if self.held:  # a live tail that might have begun a call's markup: look again with more text
            text, self.held = self.held + text, ""
        if not self.live:
            self.head += text
            start = self.head.lstrip()
            if not start or any(m.startswith(start) or start.startswith(m) for m in _CALL_STARTS):
                if start.startswith(_CALL_STARTS):
                    self.held, self.head = self.head, ""
                return ""
            self.live, text, self.head = True, self.head, ""
        cuts = [i for i in (text.find(m) for m in _OPENERS) if i >= 0]
        if cuts:
            self.held = text[min(cuts) :]
            return text[: min(cuts)]
        # hold a tail that may be the start of a call's markup
        longest = max(len(m) for m in _OPENERS)
        for k in range(min(longest - 1, len(text)), 0, -1):
            if any(m.startswith(text[-k:]) for m in _OPENERS):
                self.held = text[-k:]
                return text[:-k]
        return text

    def finish(self) -> tuple[str | None, list[ToolCall], list[dict]]:
        """(content still to send, the calls, their `delta.tool_calls` entries not sent yet) once
        the reply is complete."""
        rest = self.head + self.held
        if not rest or not rest.lstrip().startswith(_CALL_STARTS):
            return (rest or None), [], []
        content, calls = parse(rest, self.tools)
        sent = self.args.sent if self.args is not None else 0
        if not calls and self.args is not None and (sent or self.args.open):
            return None, [], []  # a call cut off (max_tokens) went out as far as it was decoded
        return content, calls, call_deltas(calls[sent:], first=sent)


def call_deltas(calls: list[ToolCall], first: int = 0) -> list[dict]:
    """OpenAI's streamed `delta.tool_calls` for complete calls: per call its id, type and name
    (arguments ""), then its arguments in fragments that concatenate to the whole JSON."""
    out = []
    for i, call in enumerate(calls, start=first):
        whole = call.as_openai()
        args = whole["function"]["arguments"]
        out.append(
            {"index": i, "id": whole["id"], "type": "function", "function": {"name": call.name, "arguments": ""}}
        )
        for at in range(0, len(args), ARGUMENT_FRAGMENT):
            out.append({"index": i, "function": {"arguments": args[at : at + ARGUMENT_FRAGMENT]}})
    return out
