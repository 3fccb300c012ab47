"""A reasoning model's `<think>` block into `reasoning_content` (server/reasoning.py): whole and
streamed piece by piece give the same split, an answer without one is untouched, a template that
opens the block is followed, and `reasoning_format: "none"` keeps the raw text. The HTTP layer runs
over a fake worker that replies with a thinking model's text."""

from __future__ import annotations

import json

import pytest
from test_server_requests import FakeWorker, make_client

from mlxcel_py.engine.stats import GenerationStats
from mlxcel_py.engine.text import TextPiece
from mlxcel_py.server.reasoning import ReasoningSplit, split
from mlxcel_py.server.worker import Result

CASES = [
    ("<think>plan a, then b</think>\n\nThe answer.", False, ("plan a, then b", "The answer.")),
    ("The answer, no thinking.", False, (None, "The answer, no thinking.")),
    ("\n  indented answer", False, (None, "\n  indented answer")),
    ("<thin", False, (None, "<thin")),
    ("<think>cut off by max_tokens", False, ("cut off by max_tokens", "")),
    ("plan</think>answer", True, ("plan", "answer")),  # the template opened the block
    ("a < b </thinking> c", False, (None, "a < b </thinking> c")),
]


@pytest.mark.parametrize("text,opened,want", CASES)
def test_split_whole_and_streamed_alike(text, opened, want):
    assert split(text, opened) == want
    for size in (1, 2, 3, 7):
        s = ReasoningSplit(opened)
        parts = []
        for i in range(0, len(text), size):
            parts += s.feed(text[i : i + size])
        parts += s.finish()
        got = (
            "".join(t for f, t in parts if f == "reasoning_content") or None,
            "".join(t for f, t in parts if f == "content"),
        )
        assert got == want, size


class ThinkingWorker(FakeWorker):
    TEXT = "<think>I should greet.</think>\n\nHello!"

    async def submit(self, job):
        self.jobs.append(job)
        for i in range(0, len(self.TEXT), 3):
            yield "text", TextPiece(self.TEXT[i : i + 3], i + 1)
        stats = GenerationStats(prompt_tokens=len(job.prompt), generated_tokens=12)
        yield "done", Result(self.TEXT, [5] * 12, "stop", None, stats, True, [])


HI = [{"role": "user", "content": "hi"}]


def test_chat_reply_splits_reasoning_and_none_keeps_it():
    client, _ = make_client(worker=ThinkingWorker())
    r = client.post("/v1/chat/completions", json={"messages": HI}).json()
    msg = r["choices"][0]["message"]
    assert msg["reasoning_content"] == "I should greet." and msg["content"] == "Hello!"
    raw = client.post("/v1/chat/completions", json={"messages": HI, "reasoning_format": "none"}).json()
    assert raw["choices"][0]["message"] == {"role": "assistant", "content": ThinkingWorker.TEXT}
    bad = client.post("/v1/chat/completions", json={"messages": HI, "reasoning_format": "sometimes"})
    assert bad.status_code == 400 and "'reasoning_format' must be one of" in bad.json()["error"]["message"]


def test_streamed_chat_sends_reasoning_deltas_then_content():
    client, _ = make_client(worker=ThinkingWorker())
    with client.stream("POST", "/v1/chat/completions", json={"messages": HI, "stream": True}) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ") and ln != "data: [DONE]"]
    deltas = [json.loads(ln[6:])["choices"][0]["delta"] for ln in lines if json.loads(ln[6:])["choices"]]
    thought = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert (thought, content) == ("I should greet.", "Hello!")
    first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert all(not d.get("reasoning_content") for d in deltas[first_content:])
