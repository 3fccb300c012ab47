"""Embeddings over HTTP under `--embeddings` (engine/embeddings.py, server/routes_embeddings.py):
the vectors are the model's last hidden states pooled and normalized as llama.cpp does, served in
OpenAI's shape (official client, base64 too) and llama-server's native one; without the flag,
with `--pooling none` on the OpenAI route, and for empty or over-long input, refusals in
llama-server's words."""

from __future__ import annotations

import base64
import math
import struct

import mlx.core as mx
import pytest
from test_server import post, start_server

from mlxcel_py.engine.embeddings import embed

TEXT = "I believe the meaning of life is"


@pytest.fixture(scope="module")
def servers(tiny_dir, tmp_path_factory):
    import os

    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path_factory.mktemp("cfg")))
    flags = {"mean": ["--embeddings", "--pooling", "mean"], "none": ["--embedding", "--pooling", "none"], "off": []}
    procs = {k: start_server(env, "-m", str(tiny_dir), "-c", "64", "--no-warmup", *v) for k, v in flags.items()}
    yield {k: url for k, (_, url, _) in procs.items()}
    for proc, _, _ in procs.values():
        proc.terminate()
        proc.wait(timeout=30)


def test_vectors_are_the_models_hidden_states_pooled_and_normalized(servers, tiny):
    import openai

    client = openai.OpenAI(api_key="x", base_url=servers["mean"] + "/v1")
    res = client.embeddings.create(model="any", input=[TEXT, "This is a test"])
    assert [d.index for d in res.data] == [0, 1]
    ids = tiny.tokenizer.encode(TEXT)
    assert res.usage.prompt_tokens == res.usage.total_tokens == len(ids) + len(tiny.tokenizer.encode("This is a test"))
    got = mx.array(res.data[0].embedding)
    assert abs(float((got * got).sum()) - 1) < 1e-4
    # the mean of the model's own last hidden states (a plain forward, no cache), normalized
    rows = tiny.model.model(mx.array([ids]))[0].astype(mx.float32)
    want = rows.mean(axis=0) / mx.sqrt((rows.mean(axis=0) ** 2).sum())
    assert float((got * want).sum()) > 0.9999
    assert embed(tiny.model, ids, "mean")[0] == pytest.approx(res.data[0].embedding, abs=1e-6)
    # base64: the same float32 values, little-endian
    status, b = post(servers["mean"] + "/v1/embeddings", {"input": TEXT, "encoding_format": "base64"})
    raw = base64.b64decode(b["data"][0]["embedding"])
    assert status == 200 and b["data"][0]["encoding_format"] == "base64"
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(res.data[0].embedding, abs=1e-6)


def test_native_shapes_pooling_none_and_the_normalizations(servers, tiny):
    status, rows = post(servers["none"] + "/embeddings", {"content": "hello hello hello"})
    n = len(tiny.tokenizer.encode("hello hello hello"))
    assert status == 200 and len(rows) == 1 and len(rows[0]["embedding"]) == n  # every token's row
    assert all(abs(sum(x * x for x in r) - 1) > 1e-3 for r in rows[0]["embedding"])  # not normalized
    status, err = post(servers["none"] + "/v1/embeddings", {"input": "hi"})
    assert status == 400 and "Pooling type 'none' is not OAI compatible" in err["error"]["message"]
    url = servers["mean"] + "/embedding"
    status, mixed = post(url, {"input": [[12, 34, 56], [12, "string", 34, 56]]})
    assert status == 200 and [m["index"] for m in mixed] == [0, 1] and len(mixed[0]["embedding"]) == 1
    _, raw = post(url, {"content": TEXT, "embd_normalize": -1})
    _, l1 = post(url, {"content": TEXT, "embd_normalize": 1})
    _, int16 = post(url, {"content": TEXT, "embd_normalize": 0})
    v = raw[0]["embedding"][0]
    assert sum(abs(x) for x in l1[0]["embedding"][0]) == pytest.approx(1, abs=1e-4)
    assert max(abs(x) for x in int16[0]["embedding"][0]) == pytest.approx(32760, rel=1e-5)
    assert l1[0]["embedding"][0] == pytest.approx([x / sum(abs(y) for y in v) for x in v], abs=1e-5)
    assert math.isfinite(sum(v))


@pytest.mark.parametrize(
    "server,body,status,message",
    [
        ("off", {"input": TEXT}, 501, "This server does not support embeddings. Start it with `--embeddings`"),
        ("mean", {"input": ""}, 400, "Input content cannot be empty"),
        ("mean", {"input": ["a", ""]}, 400, "Input content cannot be empty"),
        ("mean", {"input": "word " * 20}, 400, "is too large to process"),
        ("mean", {"input": TEXT, "encoding_format": "int8"}, 400, "Can be either float or base64"),
        ("mean", {"nothing": 1}, 400, '"input" or "content" must be provided'),
        ("mean", {"input": TEXT, "embd_normalize": "x"}, 400, "'embd_normalize' must be an integer"),
        ("mean", {"input": []}, 400, '"input" must not be empty'),
        ("mean", {"input": {"content": "string"}}, 400, '"content" must be an array of parts'),
        ("mean", {"input": {"content": [{"type": "unknown"}]}}, 400, "unsupported content[].type"),
        (
            "mean",
            {"input": {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}},
            400,
            "image input is not supported",
        ),
        ("mean", {"input": {"content": [{"type": "input_audio", "input_audio": {"data": "AAAA"}}]}}, 400, "audio"),
        ("mean", {"input": {"some": "object"}}, 400, '"input" elements must be a string'),
        ("mean", {"input": ["a", {"some": "object"}]}, 400, '"input" elements must be a string'),
        ("mean", {"input": [[1, [2]]]}, 400, '"input" elements must be a string'),
    ],
)
def test_refusals(servers, server, body, status, message):
    got, err = post(servers[server] + "/v1/embeddings", body)
    assert got == status and message in err["error"]["message"]
    assert post(servers[server] + "/completion", {"prompt": "still serving", "n_predict": 1})[0] == 200


def test_object_entries_embed_their_text_as_llama_server(servers):
    """`{"prompt_string": ...}` and OpenAI `{"content": [text parts]}` entries embed their text,
    alone or in a list beside plain strings (they embedded the object's key names before)."""
    url = servers["mean"] + "/v1/embeddings"
    vec = lambda body: [d["embedding"] for d in post(url, body)[1]["data"]]  # noqa: E731
    plain = vec({"input": ["hello world", "string2"]})
    assert vec({"input": {"prompt_string": "hello world"}}) == plain[:1]
    parts = {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}
    assert vec({"input": parts}) == plain[:1]
    assert vec({"input": [parts, {"prompt_string": "string2"}]}) == plain
