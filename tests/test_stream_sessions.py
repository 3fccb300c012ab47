"""Resumable streams (llama-server's X-Conversation-Id, server/stream_sessions.py): the session
store's rules, then the real server over sockets: a client that leaves does not stop a resumable
generation, which `GET /v1/stream` replays byte for byte from any offset; `DELETE /v1/stream`
stops it; `POST /v1/streams/lookup` finds it. Without the header a client leaving still cancels.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import time

import pytest
from conftest import make_tiny_model, wait_until
from test_server import start_server

from mlxcel_py.server import stream_sessions
from mlxcel_py.server.stream_sessions import OffsetLost, Sessions


async def _frames(parts: list[str], gate: asyncio.Event | None = None):
    for p in parts:
        if gate is not None:
            await gate.wait()
        yield p


async def _read_all(session, offset: int = 0) -> bytes:
    return b"".join([c async for c in session.read(offset)])


def test_a_session_buffers_replays_from_offsets_and_keeps_its_last_bytes(monkeypatch):
    async def run():
        s = Sessions()
        session = s.start("c", _frames(["data: a\n\n", "data: b\n\n"]))
        assert await _read_all(session) == b"data: a\n\ndata: b\n\n"
        assert await _read_all(session, 9) == b"data: b\n\n" and await _read_all(session, 18) == b""
        assert session.done and s.lookup(["c"])[0]["total_bytes"] == 18
        monkeypatch.setattr(stream_sessions, "MAX_BYTES", 10)
        small = s.start("d", _frames(["x" * 8, "y" * 8]))
        await small.producer
        assert bytes(small.buffer) == b"xxyyyyyyyy" and small.dropped == 6
        with pytest.raises(OffsetLost):
            await _read_all(small, 3)
        assert await _read_all(small, 6) == b"xxyyyyyyyy"

    asyncio.run(run())


def test_a_reader_follows_a_live_session_and_a_new_request_of_the_id_stops_the_old():
    async def run():
        s = Sessions()
        gate = asyncio.Event()
        live = s.start("c", _frames(["one ", "two "], gate))
        reader = asyncio.ensure_future(_read_all(live))
        await asyncio.sleep(0.05)
        assert not reader.done()  # nothing yet: it waits
        gate.set()
        assert await reader == b"one two "
        stuck = s.start("e", _frames(["never"], asyncio.Event()))
        await asyncio.sleep(0.01)
        s.start("e", _frames(["again"]))  # the same conversation asks again
        await asyncio.sleep(0.01)
        assert stuck.done and stuck.producer.cancelled()
        assert await _read_all(s.get("e")) == b"again"
        s.stop("e")
        assert s.get("e") is None

    asyncio.run(run())


def test_sessions_expire_after_they_end_and_their_number_is_bounded(monkeypatch):
    async def run():
        s = Sessions()
        for i in range(3):
            await s.start(f"c{i}", _frames(["x"])).producer
        monkeypatch.setattr(stream_sessions, "MAX_SESSIONS", 3)
        live = s.start("live", _frames(["y"], asyncio.Event()))
        assert sorted(s.by_id) == ["c1", "c2", "live"]  # the oldest ended session made room
        assert [d["conversation_id"] for d in s.lookup(["c1", "nothing"])] == ["c1"]
        s.by_id["c1"].completed -= stream_sessions.TTL_SECONDS + 1
        assert s.get("c1") is None and not live.done
        live.cancel()

    asyncio.run(run())


def test_lookup_matches_ids_and_their_per_model_variants():
    async def run():
        s = Sessions()
        for conv_id in ("a", "a::m1", "ab", "b::a"):
            await s.start(conv_id, _frames(["x"])).producer
        assert sorted(d["conversation_id"] for d in s.lookup(["a"])) == ["a", "a::m1"]

    asyncio.run(run())


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory):
    model = tmp_path_factory.mktemp("slow") / "m"
    make_tiny_model(model, seed=4, hidden=512, layers=8, scale=2.5)  # ~2.5 ms a token: seconds of decoding
    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path_factory.mktemp("cfg")))
    proc, url, _ = start_server(env, "-m", str(model), "--temp", "0", "--no-warmup")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def _open_stream(url: str, body: dict, conv_id: str | None) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=120)
    headers = {"Content-Type": "application/json", **({"X-Conversation-Id": conv_id} if conv_id else {})}
    c.request("POST", "/completion", json.dumps(body), headers)
    return c


def _get(url: str, path: str, method: str = "GET", body: dict | None = None) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=120)
    c.request(method, path, json.dumps(body) if body is not None else None, {"Content-Type": "application/json"})
    r = c.getresponse()
    return r.status, r.read()


def _text(raw: bytes) -> str:
    out = ""
    for line in raw.decode().splitlines():
        if line.startswith("data: {"):
            out += json.loads(line[6:]).get("content", "")
    return out


def _busy(url: str) -> bool:
    return any(s["is_processing"] for s in json.loads(_get(url, "/slots")[1]))


def test_a_client_that_leaves_does_not_stop_a_resumable_stream_which_replays_whole(slow_server):
    url = slow_server
    body = {"prompt": "abc", "n_predict": 1500, "ignore_eos": True, "stream": True}
    direct = _open_stream(url, body, None).getresponse().read()  # the same request, read to its end
    c = _open_stream(url, body, "conv-1")
    first = c.getresponse().read1(64)
    assert first.startswith(b"data: ")
    c.sock.close()  # the page is reloaded mid-stream
    c.close()
    found = json.loads(_get(url, "/v1/streams/lookup", "POST", {"conversation_ids": ["conv-1"]})[1])
    assert [d["conversation_id"] for d in found] == ["conv-1"]
    status, again = _get(url, "/v1/stream?conv_id=conv-1&from=0")  # blocks until the generation ends
    last = json.loads(again.decode().strip().splitlines()[-1][6:])
    assert status == 200 and last["stop"] and last["tokens_predicted"] == 1500  # to its last frame
    assert _text(again) == _text(direct) and len(_text(direct)) > 0  # every token, though its client left
    status, tail = _get(url, f"/v1/stream?conv_id=conv-1&from={len(again) - 100}")
    assert status == 200 and tail == again[-100:]
    found = json.loads(_get(url, "/v1/streams/lookup", "POST", {"conversation_ids": ["conv-1"]})[1])
    assert found[0]["is_done"] and found[0]["total_bytes"] == len(again) and found[0]["completed_at"] > 0
    for path, code, fragment in (
        ("/v1/stream?conv_id=conv-1&from=x", 400, b"Invalid 'from' offset"),
        ("/v1/stream?conv_id=nobody", 404, b"Stream not found or expired"),
        ("/v1/stream", 400, b"Missing conversation id"),
    ):
        status, raw = _get(url, path)
        assert status == code and fragment in raw


def test_delete_stops_a_resumable_generation_and_without_the_header_leaving_cancels(slow_server):
    url = slow_server
    long = {"prompt": "abc", "n_predict": 20000, "ignore_eos": True, "stream": True}
    c = _open_stream(url, long, "conv-2")
    c.getresponse().read1(64)
    c.sock.close()
    c.close()
    time.sleep(1.0)
    assert _busy(url)  # its client is gone; it still generates
    assert _get(url, "/v1/stream?conv_id=conv-2", "DELETE") == (204, b"")
    assert wait_until(lambda: not _busy(url), 10)  # the Stop ended it
    assert _get(url, "/v1/stream?conv_id=conv-2&from=0")[0] == 404
    assert _get(url, "/v1/stream?conv_id=conv-2", "DELETE") == (204, b"")  # again: still 204
    c = _open_stream(url, long, None)  # no header: leaving cancels, as before
    c.getresponse().read1(64)
    c.sock.close()
    c.close()
    assert wait_until(lambda: not _busy(url), 10)
