"""Vertex AI's prediction protocol (AIP_MODE=PREDICTION in the environment, as llama-server):
the real server on a tiny model, over sockets. Each instance's prediction equals the reply of the
route it names, called directly; errors are per instance; AIP_HTTP_PORT replaces --port and
AIP_HEALTH_ROUTE answers as /health; hostile bodies are 400s and the server keeps serving."""

from __future__ import annotations

import os
import socket

import pytest
from conftest import make_tiny_model
from test_server import get, post, start_server

from mlxcel_py.server.vertex import alias

CHAT = {"messages": [{"role": "user", "content": "the cat sat on the"}], "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def vertex(tmp_path_factory):
    model = make_tiny_model(tmp_path_factory.mktemp("m") / "m")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        XDG_CONFIG_HOME=str(tmp_path_factory.mktemp("cfg")),
        AIP_MODE="PREDICTION",
        AIP_HTTP_PORT=str(port),
        AIP_HEALTH_ROUTE="ping",
    )
    proc, url, lines = start_server(env, "-m", str(model), "-np", "2")  # --port 0 is replaced
    yield url, lines, port
    proc.terminate()
    proc.wait(timeout=30)


def test_llama_servers_aliases():
    assert alias("/v1/chat/completions") == "chatCompletions"
    assert alias("/apply-template") == "applyTemplate"
    assert alias("/v1/messages/count_tokens") == "messagesCountTokens"
    assert alias("/completion") == "completion"


def test_instances_run_through_the_routes_they_name(vertex):
    url, lines, port = vertex
    assert url.endswith(f":{port}") and any("AIP_HTTP_PORT" in ln for ln in lines)
    assert get(url + "/ping")["status"] == "ok"
    direct = post(url + "/v1/chat/completions", CHAT)[1]["choices"][0]["message"]["content"]
    native = post(url + "/completion", {"prompt": "the cat", "n_predict": 6, "temperature": 0})[1]["content"]
    instances = [
        {"@requestFormat": "chatCompletions", **CHAT},
        {"@requestFormat": "/v1/chat/completions", **CHAT, "stream": True},  # answered whole
        {"@requestFormat": "completion", "prompt": "the cat", "n_predict": 6, "temperature": 0},
        {"@requestFormat": "tokenize", "content": "hello"},
        {"@requestFormat": "noSuchRoute"},
        {"messages": []},
        "not an object",
        {"@requestFormat": "chatCompletions", "messages": "x"},  # the route's own 400, in its place
    ]
    status, body = post(url + "/predict", {"instances": instances})
    assert status == 200
    p = body["predictions"]
    assert len(p) == len(instances)
    assert p[0]["choices"][0]["message"]["content"] == direct
    assert p[1]["choices"][0]["message"]["content"] == direct
    assert p[2]["content"] == native
    assert p[3]["tokens"] == post(url + "/tokenize", {"content": "hello"})[1]["tokens"]
    assert "no handler registered for @requestFormat: noSuchRoute" in p[4]["error"]["message"]
    assert "string @requestFormat" in p[5]["error"]["message"]
    assert "JSON object" in p[6]["error"]["message"]
    assert "error" in p[7]


@pytest.mark.parametrize(
    "body, message",
    [
        (b"{}", "array field named instances"),
        (b'{"instances": {}}', "array field named instances"),
        (b"[1]", "JSON object"),
        (b'{"instances": [' + b",".join([b"{}"] * 129) + b"]}", "maximum size of 128"),
        (b'{"instances": ' + b"[" * 100000 + b"]" * 100000 + b"}", "nested too deeply"),
    ],
)
def test_hostile_bodies_are_400s(vertex, body, message):
    url = vertex[0]
    status, reply = post(url + "/predict", body)
    assert status == 400 and message in reply["error"]["message"], reply
    assert get(url + "/health")["status"] == "ok"
