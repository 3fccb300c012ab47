"""A reasoning model's thinking, split from its answer: `<think>...</think>` at the start of a reply
goes to `reasoning_content`, the rest to `content` (llama-server's `reasoning_format`, whose
default splits as here; `"none"` leaves the text as the model wrote it, `"deepseek-legacy"` splits it
and also keeps the whole text, tags included, in `content`).

A chat template may open the block itself (Qwen3 and DeepSeek-R1 end the generation prompt with
`<think>`): the reply then starts inside it. Streaming, text is held back only while it could still
be the opening tag or a cut-off closing one, so an answer without thinking streams as before.
"""

from __future__ import annotations

from ..formats.prompting import THINK_CLOSE as CLOSE
from ..formats.prompting import THINK_OPEN as OPEN
from ..options import REASONING_FORMATS as FORMATS  # noqa: F401 (the routes check a request's against it)


def _held(text: str, tag: str) -> int:
    """How many trailing characters of `text` could be the start of `tag`."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplit:
    """Feed a reply's text pieces; get (field, text) pairs, field `reasoning_content` or `content`."""

    def __init__(self, opened: bool = False):
        self.state = "reasoning" if opened else "start"
        self.buf = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        self.buf += text
        out: list[tuple[str, str]] = []
        while True:
            if self.state == "start":
                head = self.buf.lstrip()
                if not head or (OPEN.startswith(head) and head != OPEN):
                    return out  # not yet known: nothing, or the opening tag's first characters
                if head.startswith(OPEN):
                    self.buf, self.state = head[len(OPEN) :].lstrip("\n"), "reasoning"
                else:
                    self.state = "content"
                continue
            if self.state == "reasoning":
                i = self.buf.find(CLOSE)
                if i >= 0:
                    if self.buf[:i]:
                        out.append(("reasoning_content", self.buf[:i]))
                    self.buf, self.state = self.buf[i + len(CLOSE) :].lstrip("\n"), "after"
                    continue
                keep = _held(self.buf, CLOSE)
                ready, self.buf = self.buf[: len(self.buf) - keep], self.buf[len(self.buf) - keep :]
                if ready:
                    out.append(("reasoning_content", ready))
                return out
            if self.state == "after":  # the blank lines between the block and the answer go
                self.buf = self.buf.lstrip("\n")
                if not self.buf:
                    return out
                self.state = "content"
            if self.buf:
                out.append(("content", self.buf))
                self.buf = ""
            return out

    def finish(self) -> list[tuple[str, str]]:
        """What is still held at the end of the reply."""
        if not self.buf:
            return []
        field = "reasoning_content" if self.state == "reasoning" else "content"
        text, self.buf = self.buf, ""
        return [(field, text)]


def split(text: str, opened: bool = False) -> tuple[str | None, str]:
    """(reasoning, content) of a whole reply; reasoning None when there was none."""
    s = ReasoningSplit(opened)
    parts = s.feed(text) + s.finish()
    reasoning = "".join(t for f, t in parts if f == "reasoning_content")
    content = "".join(t for f, t in parts if f == "content")
    return (reasoning or None), content


def opened_by(prompt_tail: str) -> bool:
    """Whether the generation prompt ends inside a think block (the template opened it)."""
    tail = prompt_tail.rstrip()
    return tail.endswith(OPEN)
