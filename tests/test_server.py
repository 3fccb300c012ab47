"""The real server over real sockets: openai client, raw HTTP, SSE, timings, errors, load."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, mlxcel_cmd

pytestmark = pytest.mark.real
COPY_PROMPT = (
    "Repeat this list exactly, one item per line: apples, pears, plums, cherries, grapes, "
    "lemons, limes, oranges, peaches, apricots."
)


def start_server(env, *args):
    proc = subprocess.Popen(
        mlxcel_cmd() + ["serve", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.time() + 180
    lines = []
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            return proc, f"http://127.0.0.1:{m.group(1)}", lines
    proc.kill()
    raise RuntimeError("server did not start: " + "".join(lines))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import os

    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path_factory.mktemp("cfg")))
    proc, url, lines = start_server(env, "--draft-kind", "prompt-lookup", "--metrics")
    yield url, lines, env
    proc.terminate()
    proc.wait(timeout=30)


def sse_data(url, body) -> list[dict]:
    """The JSON of every `data:` line of a streamed POST (the closing [DONE] left out)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        lines = r.read().decode().splitlines()
    return [json.loads(ln[6:]) for ln in lines if ln.startswith("data: ") and ln != "data: [DONE]"]


def post(url, body, raw=False):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, (r.read() if raw else json.loads(r.read()))
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(url):
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def test_startup_line_names_the_drafter(server):
    _, lines, _ = server
    assert any("speculative=prompt-lookup (max_draft=7" in ln and "max_batch=2" in ln for ln in lines)
    # -np 4 (the default): the gate measured the batched forward's cost at start (engine.gate)
    assert any(
        "verify rounds while at most 2 are live and pay at the batch's measured cost (1 rows" in ln for ln in lines
    ), lines


def test_openai_client_chat_stream_and_completion(server):
    from openai import OpenAI

    url, _, _ = server
    client = OpenAI(base_url=url + "/v1", api_key="none")
    models = client.models.list()
    mid = models.data[0].id
    chat = client.chat.completions.create(
        model=mid, messages=[{"role": "user", "content": COPY_PROMPT}], max_tokens=40, temperature=0
    )
    text = chat.choices[0].message.content
    assert text and chat.usage.completion_tokens > 0
    stream = client.chat.completions.create(
        model=mid, messages=[{"role": "user", "content": COPY_PROMPT}], max_tokens=40, temperature=0, stream=True
    )
    pieces, finish = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert "".join(pieces) == text and finish in ("stop", "length")
    comp = client.completions.create(model=mid, prompt="1, 2, 3, 4, 5,", max_tokens=10, temperature=0)
    assert comp.choices[0].text


def test_timings_draft_counters_on_copy_prompt(server):
    url, _, _ = server
    body = {"messages": [{"role": "user", "content": COPY_PROMPT}], "max_tokens": 48, "temperature": 0}
    status, r = post(url + "/v1/chat/completions", body)
    assert status == 200
    t = r["timings"]
    assert t["draft_kind"] == "prompt-lookup" and t["draft_rounds"] > 0 and t["draft_n"] >= t["draft_n_accepted"] > 0
    assert t["predicted_n"] == r["usage"]["completion_tokens"]
    # logprobs with speculation on: the target's own, one entry per token, greedy picks the top one
    status, lp = post(url + "/v1/chat/completions", {**body, "logprobs": True, "top_logprobs": 2})
    assert status == 200 and lp["choices"][0]["message"]["content"] == r["choices"][0]["message"]["content"]
    content = lp["choices"][0]["logprobs"]["content"]
    assert len(content) == lp["usage"]["completion_tokens"] and lp["timings"]["draft_n_accepted"] > 0
    assert all(e["top_logprobs"][0]["token"] == e["token"] and e["logprob"] <= 0 for e in content)
    assert bytes(b for e in content for b in e["bytes"]).decode() == lp["choices"][0]["message"]["content"]
    # native route carries the same counters; its stream ends with the full object, no [DONE]
    status, n = post(url + "/completion", {"prompt": "a b c d a b c d a b c d a b", "n_predict": 16})
    assert status == 200 and list(n)[:3] == ["index", "content", "tokens"] and "timings" in n
    status, raw = post(url + "/completion", {"prompt": "a b c d a b c d", "n_predict": 8, "stream": True}, raw=True)
    frames = [json.loads(x[6:]) for x in raw.decode().split("\n\n") if x.startswith("data: ")]
    assert frames[-1]["stop"] is True and "timings" in frames[-1] and b"[DONE]" not in raw


def test_chat_stream_final_chunk_carries_timings(server):
    url, _, _ = server
    status, raw = post(
        url + "/v1/chat/completions",
        {"messages": [{"role": "user", "content": COPY_PROMPT}], "max_tokens": 32, "temperature": 0, "stream": True},
        raw=True,
    )
    frames = [x[6:] for x in raw.decode().split("\n\n") if x.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    with_finish = [c for c in chunks if c["choices"][0]["finish_reason"]]
    assert len(with_finish) == 1 and "timings" in with_finish[0]
    assert all("timings" not in c for c in chunks if not c["choices"][0]["finish_reason"])


def test_http_greedy_equals_cli_generate_with_and_without_speculation(server):
    url, _, env = server
    status, r = post(
        url + "/v1/chat/completions",
        {"messages": [{"role": "user", "content": COPY_PROMPT}], "max_tokens": 40, "temperature": 0},
    )
    http_text = r["choices"][0]["message"]["content"]
    for extra in ([], ["--prompt-lookup"]):
        out = subprocess.run(
            mlxcel_cmd() + ["generate", "-p", COPY_PROMPT, "-n", "40", *extra],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.rstrip("\n") == http_text.rstrip("\n")


@pytest.mark.parametrize(
    "body,status,etype",
    [
        (b"{not json", 400, "invalid_request_error"),
        ({"messages": "hi"}, 400, "invalid_request_error"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400, "invalid_request_error"),
        ({"messages": [{"role": "user", "content": "hi"}], "model": 9}, 400, "invalid_request_error"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}, 400, "invalid_request_error"),
        ({"messages": [{"role": "user", "content": "word " * 9000}]}, 400, "exceed_context_size_error"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            400,
            "invalid_request_error",
        ),
    ],
)
def test_bad_requests_get_4xx_and_server_keeps_serving(server, body, status, etype):
    url, _, _ = server
    code, r = post(url + "/v1/chat/completions", body)
    assert code == status
    assert {"message", "type", "code"} <= set(r["error"]) and r["error"]["type"] == etype
    if etype == "exceed_context_size_error":  # llama-server's fields and words, for clients that trim and retry
        assert "exceeds the available context size" in r["error"]["message"]
        assert r["error"]["n_prompt_tokens"] > r["error"]["n_ctx"] > 0
    else:
        assert set(r["error"]) == {"message", "type", "code"}
    assert get(url + "/health")["status"] == "ok"


@pytest.mark.parametrize(
    "route,body",
    [
        ("/v1/completions", {"prompt": [1000000000], "max_tokens": 4}),
        ("/v1/completions", {"prompt": [5, -1], "max_tokens": 4}),
        ("/completion", {"prompt": [49152], "n_predict": 4}),  # one past the default model's vocabulary
        ("/detokenize", {"tokens": [10**12]}),
        ("/detokenize", {"tokens": [True]}),
    ],
)
def test_out_of_vocabulary_token_ids_get_400_not_a_crash(server, route, body):
    url, _, _ = server
    code, r = post(url + route, body)
    msg = r["error"]["message"]
    assert code == 400
    assert "token ids must be integers in 0..49151" in msg or msg.startswith(
        "'tokens.0': Input should be a valid integer"
    )
    assert get(url + "/health")["status"] == "ok"
    code, ok = post(url + "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2})
    assert code == 200 and ok["usage"]["prompt_tokens"] == 3


def test_tokenize_roundtrip(server):
    url, _, _ = server
    _, t = post(url + "/tokenize", {"content": "hello world"})
    _, d = post(url + "/detokenize", {"tokens": t["tokens"]})
    assert d["content"] == "hello world"
    text = "héllo 日本 🙂"
    _, p = post(url + "/tokenize", {"content": text, "with_pieces": True})
    raw = b"".join(x["piece"].encode() if isinstance(x["piece"], str) else bytes(x["piece"]) for x in p["tokens"])
    assert raw.decode() == text  # pieces that split a character come back as their bytes
    assert any(isinstance(x["piece"], list) for x in p["tokens"])


def test_disconnect_mid_stream_frees_the_worker(server):
    import http.client

    url, _, _ = server
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request(
        "POST",
        "/v1/chat/completions",
        json.dumps(
            {
                "messages": [{"role": "user", "content": "Write a very long story."}],
                "max_tokens": 2000,
                "stream": True,
                "ignore_eos": True,
            }
        ),
        {"Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    resp.read1(200)
    conn.close()
    start = time.time()
    code, r = post(url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert code == 200
    assert time.time() - start < 60  # did not wait for 2000 tokens
    deadline = time.time() + 10
    while get(url + "/health")["batch"]["active_sequences"] and time.time() < deadline:
        time.sleep(0.2)
    assert get(url + "/health")["batch"]["active_sequences"] == 0


def test_load_script_4_clients_x_2_requests(server):
    url, _, _ = server
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "load_test.py"),
            "--url",
            url,
            "--clients",
            "4",
            "--requests",
            "2",
            "--max-tokens",
            "6",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "8 ok, 0 errors" in r.stdout and "/health: ok" in r.stdout


def test_mlxcel_server_script_and_api_key(tmp_path):
    import os

    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from mlxcel_py.commands.serve import server_main; server_main()",
            "--port",
            "0",
            "--api-key",
            "s3cret",
            "--no-warmup",
            "--alias",
            " tinyllama-2, fim,code,",
            "--tags",
            "chat,small",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        url = None
        for _ in range(200):
            line = proc.stderr.readline()
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
            if m:
                url = m.group(1)
                break
        assert url, "mlxcel-server did not start"
        assert get(url + "/health")["status"] == "ok"  # no key needed for health
        req = urllib.request.Request(
            url + "/tokenize", data=b'{"content": "hi"}', headers={"Content-Type": "application/json"}
        )
        try:
            urllib.request.urlopen(req, timeout=30)
            raise AssertionError("expected 401")
        except urllib.error.HTTPError as e:
            assert e.code == 401 and json.loads(e.read())["error"]["type"] == "authentication_error"
        req = urllib.request.Request(
            url + "/tokenize",
            data=b'{"content": "hi"}',
            headers={"Authorization": "Bearer s3cret", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert json.loads(resp.read())["tokens"]
        with urllib.request.urlopen(url + "/v1/models", timeout=30) as resp:  # public, as in llama-server
            model = json.loads(resp.read())["data"][0]
        # llama-server's comma-separated --alias and --tags (llama.cpp's test_server_model_aliases_and_tags):
        # the id is the first alias in alphabetical order
        assert model["id"] == "code" and model["aliases"] == ["code", "fim", "tinyllama-2"]
        assert model["tags"] == ["chat", "small"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _send_and_hang_up(url: str, path: str, body: dict, after: float) -> None:
    """A client that sends a non-streaming request and closes its socket `after` seconds later."""
    import socket

    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall(
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    time.sleep(after)
    s.close()


def _until_idle(url: str, limit: float) -> float:
    start = time.time()
    while get(url + "/health")["batch"]["active_sequences"] and time.time() - start < limit:
        time.sleep(0.05)
    assert get(url + "/health")["batch"]["active_sequences"] == 0
    return time.time() - start


def test_non_streaming_request_is_cancelled_when_its_client_leaves(server):
    url, _, _ = server
    _send_and_hang_up(
        url, "/v1/completions", {"prompt": "Count from 1 to 10000:", "max_tokens": 3000, "ignore_eos": True}, after=1.0
    )
    assert _until_idle(url, 10) < 1.0  # freed within a second (0.2 s polls), not after 3000 tokens


def test_a_client_leaving_during_a_long_prefill_frees_the_worker_before_it_ends(server):
    url, _, _ = server
    prompt = [100 + (i * 7) % 5000 for i in range(1100)]  # three prefill chunks (cache.PREFILL_CHUNK)
    start = time.time()
    code, _ = post(url + "/v1/completions", {"prompt": prompt, "max_tokens": 1})
    full = time.time() - start
    assert code == 200
    _send_and_hang_up(url, "/v1/completions", {"prompt": prompt, "max_tokens": 1}, after=0.3)
    freed = 0.3 + _until_idle(url, 60)
    assert freed < full * 0.75, (freed, full)


def test_sigterm_during_a_long_generation_ends_the_server_in_seconds(tmp_path):
    import http.client
    import os
    import signal
    import threading

    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path))
    proc, url, _ = start_server(env, "--no-warmup", "--shutdown-grace", "1")
    try:
        outcome = []

        def client():
            try:
                outcome.append(
                    post(
                        url + "/v1/completions", {"prompt": "Count to 10000:", "max_tokens": 5000, "ignore_eos": True}
                    )[0]
                )
            except (OSError, http.client.HTTPException, ValueError) as exc:  # cut off, or a non-JSON 5xx
                outcome.append(type(exc).__name__)

        t = threading.Thread(target=client, daemon=True)
        t.start()
        deadline = time.time() + 30
        while not get(url + "/health")["batch"]["active_sequences"] and time.time() < deadline:
            time.sleep(0.1)
        start = time.time()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        assert time.time() - start < 10
        assert proc.returncode == 143  # 128 + SIGTERM after the cleanup, not an abort (134)
        t.join(timeout=10)
        assert outcome == [503]  # the client got an answer ("the server is shutting down"), not a hang
    finally:
        if proc.poll() is None:
            proc.kill()


def test_100_concurrent_clients_get_200_or_503_never_a_5xx_or_a_hang(server):
    """More clients than the queue holds (64): the rest get a quick 503 with Retry-After."""
    from concurrent.futures import ThreadPoolExecutor

    url, _, _ = server

    def one(i):
        data = json.dumps({"prompt": f"{i} apples", "max_tokens": 1, "temperature": 0}).encode()
        req = urllib.request.Request(url + "/v1/completions", data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, None
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Retry-After")

    with ThreadPoolExecutor(100) as pool:
        results = list(pool.map(one, range(100)))
    codes = {c for c, _ in results}
    assert codes <= {200, 503}, codes
    assert any(c == 200 for c, _ in results)
    assert all(retry == "1" for c, retry in results if c == 503)
    assert get(url + "/health")["status"] == "ok"


def test_prompt_cache_reuses_a_shared_prefix_and_changes_nothing(server):
    """A resent prompt, and a chat that shares a long system prompt, skip what was prefilled before;
    the text is what a cold request gets (the row-exact path prefills in exact 64-row pieces)."""
    url, lines, env = server
    assert any("prompt cache:" in ln and "8192 MiB" in ln for ln in lines)
    body = {"prompt": "Name three rivers in Europe and one fact about each.", "n_predict": 24, "temperature": 0}
    _, first = post(url + "/completion", body)
    _, again = post(url + "/completion", body)
    assert again["content"] == first["content"]
    assert again["timings"]["cache_n"] == again["tokens_evaluated"] - 1
    # llama-server's cache_prompt: false feeds the whole prompt again, to the same text
    _, whole = post(url + "/completion", dict(body, cache_prompt=False))
    assert whole["content"] == first["content"] and whole["timings"]["cache_n"] == 0
    ask = {"messages": [{"role": "user", "content": body["prompt"]}], "max_tokens": 4, "temperature": 0}
    cached = [post(url + "/v1/chat/completions", b)[1] for b in (ask, ask, dict(ask, cache_prompt=False))]
    assert cached[1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 10  # the control: a cached prefix
    assert cached[2]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert cached[2]["choices"][0]["message"] == cached[1]["choices"][0]["message"]
    code, bad = post(url + "/completion", dict(body, cache_prompt="no"))  # strict: a string is not a bool
    assert code == 400 and "cache_prompt" in json.dumps(bad)
    _, default = post(url + "/completion", dict(body, cache_prompt=None))  # null: the default, as llama-server
    assert default["timings"]["cache_n"] == default["tokens_evaluated"] - 1
    system = "You are a careful assistant. " + "Answer in plain words, never in lists. " * 12
    asks = ["What is a river delta?", "Why is the sea salty?"]
    replies = []
    for ask in asks:
        _, r = post(
            url + "/v1/chat/completions",
            {
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": ask}],
                "max_tokens": 16,
                "temperature": 0,
            },
        )
        replies.append(r)
    cached = replies[1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 100, replies[1]["usage"]  # the system prompt came from the cache
    cold = subprocess.run(
        mlxcel_cmd() + ["generate", "-p", asks[1], "--system", system, "-n", "16"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert cold.stdout.rstrip("\n") == replies[1]["choices"][0]["message"]["content"].rstrip("\n")


def test_metrics_count_requests_tokens_and_drafts(server):
    url, _, _ = server

    def scrape():
        with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
            assert r.headers["Content-Type"].startswith("text/plain")
            text = r.read().decode()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    before = scrape()
    _, r = post(
        url + "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": COPY_PROMPT}],
            "max_tokens": 30,
            "temperature": 0,
            "ignore_eos": True,
        },
    )
    after = scrape()
    delta = lambda k: after.get(k, 0.0) - before.get(k, 0.0)  # noqa: E731
    assert r["usage"]["completion_tokens"] == 30 and r["choices"][0]["finish_reason"] == "length"
    assert delta("mlxcel_tokens_predicted_total") == 30
    assert delta('mlxcel_requests_total{outcome="length"}') == 1
    assert delta("mlxcel_prompt_tokens_total") + delta("mlxcel_prompt_tokens_cached_total") > 20
    assert delta("mlxcel_speculative_rounds_total") > 0 and delta("mlxcel_draft_tokens_accepted_total") > 0
    assert after["mlxcel_requests_processing"] == 0 and after["mlxcel_prompt_cache_entries"] >= 1
    assert after["mlxcel_prompt_cache_bytes"] > 0
    # llama-server's names, for dashboards made for it
    assert delta("llamacpp:tokens_predicted_total") == 30 and delta("llamacpp:tokens_predicted_seconds_total") > 0
    assert delta("llamacpp:prompt_tokens_total") == delta("mlxcel_prompt_tokens_total")
    assert after["llamacpp:predicted_tokens_seconds"] > 0 and after["llamacpp:requests_processing"] == 0
    assert after["llamacpp:requests_deferred"] == 0


def test_slots_show_the_request_being_decoded(server):
    import http.client

    url, _, _ = server
    idle = get(url + "/slots")
    assert len(idle) == 4 and not any(s["is_processing"] for s in idle) and idle[0]["speculative"] is True
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request(
        "POST",
        "/completion",
        json.dumps({"prompt": "Count upwards from one:", "n_predict": 400, "stream": True, "ignore_eos": True}),
        {"Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    resp.read1(300)
    busy = [s for s in get(url + "/slots") if s["is_processing"]]
    health = get(url + "/health")
    conn.close()
    assert len(busy) == 1 and busy[0]["next_token"][0]["n_decoded"] > 0 and busy[0]["n_ctx"] > 0
    assert busy[0]["prompt"].endswith("Count upwards from one:") and idle[0]["prompt"] == ""
    assert busy[0]["speculating_now"] is True  # alone: under the gate
    assert health["slots_processing"] == 1 and health["slots_idle"] == 3


def test_props_root_and_a_plain_request_beside_the_drafter(server):
    """/props (llama-server's shape plus `speculative`); `/` is JSON health for a client that
    asks for JSON and the chat page for the rest; `speculative.n_max: 0` decodes one request plainly, same text."""
    url, _, _ = server
    p = get(url + "/props")
    assert p["speculative"] == {"enabled": True, "kind": "prompt-lookup", "plain_request_field": "speculative.n_max"}
    assert p["total_slots"] == 4 and p["default_generation_settings"]["n_ctx"] > 0
    assert Path(p["model_path"]).is_file() and p["model_path"].endswith(".gguf")  # the file, not its conversion (#52)
    assert re.fullmatch(r"b\d+-mlxcel-py-\S+", p["build_info"])  # llama-server's b<build>-... form (#52)
    model = get(url + "/v1/models")["data"][0]
    assert model["id"] == "SmolLM2-135M-Instruct" and model["aliases"] == [] and model["tags"] == []
    # llama-server's meta block: SmolLM2-135M has 134,515,008 parameters, 576 wide, a GPT-2 style BPE
    assert model["meta"] == {
        "vocab_type": 2,
        "n_vocab": 49152,
        "n_ctx": p["default_generation_settings"]["n_ctx"],
        "n_ctx_train": 8192,
        "n_embd": 576,
        "n_params": 134515008,
        "size": Path(p["model_path"]).stat().st_size,
    }
    assert p["default_generation_settings"]["params"]["seed"] == 4294967295  # random, as llama-server says
    json_client = urllib.request.Request(url + "/", headers={"Accept": "application/json"})
    with urllib.request.urlopen(json_client, timeout=60) as r:
        assert json.loads(r.read())["status"] == "ok"
    req = urllib.request.Request(url + "/", headers={"Accept": "text/html,application/xhtml+xml"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in r.headers["content-security-policy"]
        assert b"<title>mlxcel-py chat</title>" in r.read()
    body = {"messages": [{"role": "user", "content": COPY_PROMPT}], "max_tokens": 40, "temperature": 0}
    _, spec = post(url + "/v1/chat/completions", body)
    _, plain = post(url + "/v1/chat/completions", {**body, "speculative.n_max": 0})
    assert spec["timings"].get("draft_rounds", 0) > 0 and "draft_rounds" not in plain["timings"]
    assert plain["choices"][0]["message"]["content"] == spec["choices"][0]["message"]["content"]
    status, err = post(url + "/v1/chat/completions", {**body, "speculative.n_max": 4})
    assert status == 400 and "'speculative.n_max'" in err["error"]["message"] and "only 0" in err["error"]["message"]
    # llama-server's speculative.n_min (--draft-min): no prompt-lookup draft is 64 long, so none is verified
    _, short = post(url + "/v1/chat/completions", {**body, "speculative.n_min": 64})
    assert "draft_rounds" not in short["timings"]
    assert short["choices"][0]["message"]["content"] == spec["choices"][0]["message"]["content"]
    _, native = post(url + "/completion", {"prompt": COPY_PROMPT, "n_predict": 4, "speculative.n_min": 2})
    assert native["generation_settings"]["speculative.n_min"] == 2
    status, err = post(url + "/v1/chat/completions", {**body, "speculative.n_min": -1})
    assert status == 400 and "speculative.n_min" in err["error"]["message"]


def test_extreme_temperatures_sample_real_tokens(server):
    """A temperature of 1e-300 decodes greedily; 1e308 draws uniformly among the filtered tokens
    (both once sampled token 0, `<|endoftext|>`, every step: 1/temp overflowed the logits)."""
    url, _, _ = server
    body = {"messages": [{"role": "user", "content": COPY_PROMPT}], "max_tokens": 24, "seed": 5}
    _, greedy = post(url + "/v1/chat/completions", {**body, "temperature": 0})
    _, tiny = post(url + "/v1/chat/completions", {**body, "temperature": 1e-300})
    assert tiny["choices"][0]["message"]["content"] == greedy["choices"][0]["message"]["content"]
    _, huge = post(url + "/v1/chat/completions", {**body, "temperature": 1e308, "top_k": 40, "min_p": 0})
    text = huge["choices"][0]["message"]["content"]
    assert huge["usage"]["completion_tokens"] == 24 and "<|endoftext|>" not in text and text.strip()


def test_a_client_that_hangs_up_mid_upload_is_a_499_not_a_500(tiny_dir, tmp_path):
    import os
    import socket
    import threading
    from urllib.parse import urlparse

    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    proc, url, _ = start_server(env, "-m", str(tiny_dir), "--metrics")
    log: list[str] = []
    reader = threading.Thread(target=lambda: log.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        u = urlparse(url)
        s = socket.create_connection((u.hostname, u.port))
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 5000\r\n\r\n" + b'{"messages": [{"role"'
        )
        time.sleep(0.3)
        s.close()  # mid-body
        deadline = time.time() + 20
        while time.time() < deadline and not any("499" in ln for ln in log):
            time.sleep(0.1)
        assert any("client closed the connection (499)" in ln for ln in log), "".join(log)
        assert not any(" 500" in ln or "failed: ClientDisconnect" in ln for ln in log), "".join(log)
        assert get(url + "/health")["status"] == "ok"
        assert "mlxcel_requests_total{" not in urllib.request.urlopen(url + "/metrics").read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_sigterm_mid_stream_sends_a_final_error_chunk_and_done(tmp_path):
    """After the grace, a stream used to just stop (no error event, no [DONE])."""
    import os
    import signal
    import threading

    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path))
    proc, url, _ = start_server(env, "--no-warmup", "--shutdown-grace", "2")
    try:
        frames: list[str] = []
        started = threading.Event()

        def client():
            body = {"prompt": "Count to 10000:", "max_tokens": 5000, "ignore_eos": True, "stream": True}
            req = urllib.request.Request(
                url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=60) as r:
                for line in r:
                    if line.startswith(b"data: "):
                        frames.append(line[6:].decode().strip())
                        started.set()

        t = threading.Thread(target=client, daemon=True)
        t.start()
        assert started.wait(60)
        proc.send_signal(signal.SIGTERM)
        t.join(timeout=30)
        assert not t.is_alive()
        assert frames[-1] == "[DONE]", frames[-3:]
        final = json.loads(frames[-2])
        assert final["error"]["type"] == "unavailable_error" and "shutting down" in final["error"]["message"]
        assert all("error" not in json.loads(f) for f in frames[:-2])  # text frames until then
        assert proc.wait(timeout=20) == 143
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_ends_a_queued_stream_with_an_error_chunk_and_done_too(tmp_path):
    """-np 1 and two streams: the queued one got its role chunk, then a cut chunked body."""
    import os
    import signal
    import threading

    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path))
    proc, url, _ = start_server(env, "--no-warmup", "--shutdown-grace", "2", "-np", "1")
    try:
        frames: list[list[str]] = [[], []]
        errors: list[BaseException] = []
        started = threading.Event()

        def client(i: int) -> None:
            body = {"messages": [{"role": "user", "content": "Count to 10000"}], "max_tokens": 5000}
            req = urllib.request.Request(
                url + "/v1/chat/completions",
                data=json.dumps({**body, "ignore_eos": True, "stream": True}).encode(),
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    for line in r:
                        if line.startswith(b"data: "):
                            frames[i].append(line[6:].decode().strip())
                            if i == 0 and len(frames[0]) > 2:
                                started.set()
            except BaseException as exc:  # a cut body (http.client.IncompleteRead) lands here
                errors.append(exc)

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(2)]
        threads[0].start()
        assert started.wait(60)
        threads[1].start()
        time.sleep(1.0)  # queued behind the first (one slot)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=30)
            assert not t.is_alive()
        assert errors == []
        for got in frames:
            assert got[-1] == "[DONE]", got[-3:]
            final = json.loads(got[-2])
            assert final["error"]["type"] == "unavailable_error" and "shutting down" in final["error"]["message"]
        assert proc.wait(timeout=20) == 143
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_prompt_too_long_for_any_tokenization_is_refused_before_tokenizing(server):
    """7 MB under the body limit: refused at once, not after 7-10 s of tokenizing (and +336 MB)."""
    url, _, _ = server
    text = "word " * 1_400_000  # 7 MB of text
    start = time.perf_counter()
    status, err = post(url + "/v1/chat/completions", {"messages": [{"role": "user", "content": text}], "max_tokens": 1})
    took = time.perf_counter() - start
    assert status == 400 and err["error"]["type"] == "exceed_context_size_error"
    assert "characters" in err["error"]["message"] and took < 5, took
    status, err = post(url + "/v1/completions", {"prompt": text, "max_tokens": 1})
    assert status == 400 and err["error"]["type"] == "exceed_context_size_error"
    assert get(url + "/health")["status"] == "ok"


def test_slowloris_connections_are_closed_and_real_clients_still_served(tiny_dir, tmp_path):
    """Headers sent a byte at a time, and a body that never finishes, no longer hold connections."""
    import os
    import socket
    from urllib.parse import urlparse

    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        XDG_CONFIG_HOME=str(tmp_path / "cfg"),
        MLXCEL_HEADER_TIMEOUT="2",
        MLXCEL_BODY_TIMEOUT="2",
    )
    proc, url, _ = start_server(env, "-m", str(tiny_dir))
    try:
        u = urlparse(url)
        fds = lambda: len(os.listdir(f"/proc/{proc.pid}/fd"))  # noqa: E731
        before = fds()
        slow = []
        for _ in range(60):
            s = socket.create_connection((u.hostname, u.port))
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # and never the rest
            slow.append(s)
        body = socket.create_connection((u.hostname, u.port))
        body.sendall(
            b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        assert get(url + "/health")["status"] == "ok"  # served beside them
        time.sleep(0.5)
        assert fds() >= before + 50
        for s in slow:
            s.settimeout(10)
            assert s.recv(100) == b""  # closed by the server, within the header deadline
        body.settimeout(10)
        reply = b""
        while b"}}" not in reply:  # the status line and headers, then the JSON error
            more = body.recv(4096)
            if not more:
                break
            reply += more
        assert b" 408 " in reply.split(b"\r\n")[0] and b"did not arrive within 2 s" in reply
        deadline = time.time() + 10
        while fds() > before + 5 and time.time() < deadline:
            time.sleep(0.2)
        assert fds() <= before + 5
        assert get(url + "/health")["status"] == "ok"
        with pytest.raises(urllib.error.HTTPError) as no_metrics:  # not started with --metrics
            urllib.request.urlopen(url + "/metrics", timeout=30)
        assert no_metrics.value.code == 501 and "--metrics" in no_metrics.value.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_request_deadline_ends_decoding_with_finish_reason_length(server):
    """max_tokens 10**12 with -n -1 held a slot until the context filled: t_max_predict_ms (and the
    server's --max-predict-ms, 5 minutes by default) bound it by time, as llama-server's does."""
    url, _, _ = server
    body = {"prompt": "Count from 1 to 100000:", "max_tokens": 10**12, "ignore_eos": True, "t_max_predict_ms": 300}
    start = time.perf_counter()
    status, r = post(url + "/v1/completions", body)
    took = time.perf_counter() - start
    assert status == 200 and r["choices"][0]["finish_reason"] == "length"
    assert 0 < r["usage"]["completion_tokens"] < 1000 and took < 10, (r["usage"], took)
    status, err = post(url + "/v1/completions", {**body, "t_max_predict_ms": -5})
    assert status == 400 and "'t_max_predict_ms' must be >= 0" in err["error"]["message"]
    assert get(url + "/health")["slots_processing"] == 0


def test_anthropic_client_messages_stream_stops_and_count_tokens(server):
    """The official `anthropic` client against /v1/messages: the same greedy text as the OpenAI
    route, Anthropic's stop reasons, its streaming events, count_tokens and its error shape."""
    import anthropic

    url, _, _ = server
    client = anthropic.Anthropic(base_url=url, api_key="none")
    GREEDY = {"temperature": 0}  # this SDK takes sampling fields through extra_body
    msgs = [{"role": "user", "content": COPY_PROMPT}]
    m = client.messages.create(model="local", max_tokens=40, messages=msgs, system="Be exact.", extra_body=GREEDY)
    assert m.type == "message" and m.role == "assistant" and m.content[0].type == "text"
    assert m.stop_reason in ("end_turn", "max_tokens") and m.usage.input_tokens > 0 and m.usage.output_tokens > 0
    _, oa = post(
        url + "/v1/chat/completions",
        {
            "messages": [{"role": "system", "content": "Be exact."}, *msgs],
            "max_tokens": 40,
            "temperature": 0,
        },
    )
    assert m.content[0].text == oa["choices"][0]["message"]["content"]
    cut = client.messages.create(model="local", max_tokens=3, messages=msgs, extra_body=GREEDY)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    word = m.content[0].text.split()[2]
    stopped = client.messages.create(
        model="local", max_tokens=40, messages=msgs, stop_sequences=[word], extra_body=GREEDY
    )
    assert (
        stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word and word not in stopped.content[0].text
    )
    with client.messages.stream(
        model="local", max_tokens=40, messages=msgs, system="Be exact.", extra_body=GREEDY
    ) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == m.content[0].text == final.content[0].text
    assert final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens
    n = client.messages.count_tokens(model="local", messages=msgs, system="Be exact.")
    assert n.input_tokens == m.usage.input_tokens
    try:
        client.messages.create(model="local", max_tokens=8, messages=[{"role": "robot", "content": "hi"}])
        raise AssertionError("a bad role was accepted")
    except anthropic.BadRequestError as exc:
        assert exc.body["type"] == "error" and exc.body["error"]["type"] == "invalid_request_error"


def test_anthropic_route_refuses_bad_bodies_in_its_own_shape(server):
    url, _, _ = server
    hi = [{"role": "user", "content": "hi"}]
    cases = [
        ({"messages": hi}, "max_tokens"),  # required there
        ({"max_tokens": 0, "messages": hi}, "'max_tokens' must be at least 1"),
        (
            {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
            "'document' blocks are not supported",
        ),
        (
            {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
            "an image block needs a 'source' object",
        ),
        ({"max_tokens": 8, "messages": hi, "tools": [{"name": "f"}]}, "'tools.0.input_schema': Field required"),
        ({"max_tokens": 8, "messages": hi, "tool_choice": {"type": "maybe"}}, "'tool_choice': type must be"),
        ({"max_tokens": 8, "messages": hi, "temperature": 1e308, "repeat_penalty": 0}, "repeat_penalty"),
    ]
    for body, fragment in cases:
        status, err = post(url + "/v1/messages", body)
        assert status == 400 and err["type"] == "error", (body, err)
        assert err["error"]["type"] == "invalid_request_error" and fragment in err["error"]["message"], (body, err)
    assert get(url + "/health")["status"] == "ok"
    # no messages beside a system prompt: taken, as llama-server takes it
    status, reply = post(url + "/v1/messages", {"max_tokens": 4, "messages": [], "system": "Say hi."})
    assert status == 200 and reply["type"] == "message" and reply["usage"]["output_tokens"] > 0
    status, counted = post(url + "/v1/messages/count_tokens", {"messages": [], "system": "Say hi."})
    assert status == 200 and counted["input_tokens"] > 0
    # nor any system: the template renders what it has (its generation prompt), as llama-server does
    status, reply = post(url + "/v1/messages", {"max_tokens": 4, "messages": []})
    assert status == 200 and reply["type"] == "message" and reply["usage"]["input_tokens"] > 0


def test_llama_server_stream_shapes(server):
    """The first chat chunk has the role and content null; with stream_options.include_usage the
    usage and timings come in a last chunk with choices []; the fingerprint is b<build>-<hash>."""
    import urllib.request

    url, _, _ = server

    def chunks(path, body):
        req = urllib.request.Request(
            url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=300) as r:
            lines = [ln.decode().strip() for ln in r]
        data = [ln[len("data: ") :] for ln in lines if ln.startswith("data: ")]
        assert data[-1] == "[DONE]"
        return [json.loads(d) for d in data[:-1]]

    msgs = [{"role": "user", "content": "Say hi."}]
    got = chunks("/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "stream": True})
    assert got[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert got[0]["system_fingerprint"].startswith("b") and "usage" in got[-1]
    got = chunks(
        "/v1/chat/completions",
        {"messages": msgs, "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert got[-1]["choices"] == [] and got[-1]["usage"]["completion_tokens"] > 0 and "timings" in got[-1]
    assert got[-2]["choices"][0]["finish_reason"] in ("stop", "length") and "usage" not in got[-2]
    got = chunks(
        "/v1/completions",
        {"prompt": "1, 2,", "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert got[-1]["choices"] == [] and got[-1]["usage"]["completion_tokens"] > 0


def test_llama_server_prompt_forms_choices_counts_and_cors_over_a_socket(server):
    from openai import OpenAI

    url, _, _ = server
    prompt = "I believe the meaning of life is"
    _, tok = post(url + "/tokenize", {"content": prompt, "add_special": True})
    ids = tok["tokens"]
    # llama-server's test_completion_with_tokens_input: ids, a batch, ids and text mixed
    _, single = post(url + "/completion", {"prompt": ids, "n_predict": 8, "temperature": 0})
    _, batch = post(url + "/completion", {"prompt": [ids, prompt], "n_predict": 8, "temperature": 0})
    assert isinstance(batch, list) and [b["content"] for b in batch] == [single["content"]] * 2
    _, mixed = post(url + "/completion", {"prompt": [1, 2, 3, prompt, 7, prompt], "n_predict": 4})
    assert isinstance(mixed["content"], str) and mixed["tokens_evaluated"] > 2 * len(ids)
    assert single["generation_settings"]["n_predict"] == 8
    # stream frames carry their tokens, which decode to the streamed text
    req = urllib.request.Request(
        url + "/completion",
        data=json.dumps({"prompt": prompt, "n_predict": 8, "temperature": 0, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        frames = [json.loads(ln[6:]) for ln in r.read().decode().splitlines() if ln.startswith("data: ")]
    _, whole = post(url + "/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0, "return_tokens": True})
    assert [t for f in frames[:-1] for t in f["tokens"]] == whole["tokens"]
    assert "".join(f["content"] for f in frames) == whole["content"]
    assert frames[-1]["generation_settings"]["n_predict"] == 8 and frames[-1]["stop"] is True
    # n greedy choices are the same reply; the token count is the chat route's prompt
    client = OpenAI(base_url=url + "/v1", api_key="none")
    messages = [{"role": "user", "content": COPY_PROMPT}]
    r = client.chat.completions.create(model="m", messages=messages, n=2, max_tokens=24, temperature=0)
    assert len(r.choices) == 2 and r.choices[0].message.content == r.choices[1].message.content
    _, count = post(url + "/v1/chat/completions/input_tokens", {"messages": messages})
    assert count["input_tokens"] == r.usage.prompt_tokens
    # llama-server's default CORS: a preflight from any page is answered before any key check
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        method="OPTIONS",
        headers={"Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == "http://localhost:5173"
        assert r.headers["Access-Control-Allow-Credentials"] == "true"
        # spelled as llama-server sends them, for clients that copy headers into a plain dict
        raw = dict(r.getheaders())
        assert (
            raw["Access-Control-Allow-Methods"] == "GET, POST, DELETE, OPTIONS"
            and raw["Access-Control-Allow-Headers"] == "*"
        )


def test_an_assistant_prefill_is_continued_through_the_model_template(server):
    url, _, _ = server
    messages = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "The answer is"}]
    _, rendered = post(url + "/apply-template", {"messages": messages})
    assert rendered["prompt"].endswith("<|im_start|>assistant\nThe answer is")  # open: no <|im_end|>
    _, plain = post(url + "/apply-template", {"messages": messages[:1]})
    assert plain["prompt"].endswith("<|im_start|>assistant\n")
    status, r = post(url + "/v1/chat/completions", {"messages": messages, "max_tokens": 6, "temperature": 0})
    assert status == 200 and r["choices"][0]["message"]["content"]


def test_return_progress_reports_each_prompt_chunk_as_llama_server(server):
    url, _, _ = server

    def progress() -> list[dict]:
        body = {
            "messages": [{"role": "user", "content": "This is a test of prompt progress. " * 40}],
            "max_tokens": 4,
            "temperature": 0,
            "stream": True,
            "return_progress": True,
        }
        return [f["prompt_progress"] for f in sse_data(url + "/v1/chat/completions", body) if "prompt_progress" in f]

    first = progress()
    assert len(first) >= 3 and first[0]["cache"] == first[0]["processed"]
    assert all(p["total"] == first[0]["total"] for p in first)
    assert all(b["processed"] > a["processed"] for a, b in zip(first, first[1:]))
    assert first[-1]["processed"] == first[-1]["total"]
    again = progress()  # the prompt cache holds the prompt now: the first report says so
    assert again[0]["cache"] > 0 and again[0]["cache"] == again[0]["processed"] and len(again) < len(first)


def _llama_metrics(url) -> tuple[dict, str, Any]:
    """/metrics' llamacpp: series read as llama.cpp's test_metrics.py reads them ({name: (type,
    value)}: each must have a TYPE line of its full name), the raw text and the headers."""
    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
        text, headers = r.read().decode(), r.headers
    types, out = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line.startswith("llamacpp:") and "{" not in line:
            name, value = line.split(" ", 1)
            assert name in types, f"{name} has no # TYPE line"
            out[name] = (types[name], float(value))
    return out, text, headers


def test_metrics_speak_llama_servers_series_and_average_over_each_scrape(server):
    url, _, _ = server
    _llama_metrics(url)  # empties the throughput window
    before, _, _ = _llama_metrics(url)
    assert before["llamacpp:predicted_tokens_seconds"] == ("gauge", 0.0)  # nothing ran since
    body = {"prompt": COPY_PROMPT, "n_predict": 24, "temperature": 0, "ignore_eos": True}
    runs = [post(url + "/completion", body)[1] for _ in range(2)]
    after, text, headers = _llama_metrics(url)
    assert int(headers["Process-Start-Time-Unix"]) <= time.time()
    delta = lambda k: after[f"llamacpp:{k}"][1] - before[f"llamacpp:{k}"][1]  # noqa: E731
    total = lambda k: sum(r["timings"].get(k, 0) for r in runs)  # noqa: E731
    for name in ("prompt_tokens_total", "prompt_tokens_cached_total", "tokens_predicted_total", "n_decode_total"):
        assert after[f"llamacpp:{name}"][0] == "counter" and f"# HELP llamacpp:{name} " in text
    assert delta("prompt_tokens_total") == total("prompt_n") and delta("tokens_predicted_total") == 48
    assert delta("prompt_tokens_cached_total") == total("cache_n") > 0  # the second run reused the prompt
    assert delta("spec_decode_num_drafts_total") == total("draft_rounds") > 0
    assert delta("spec_decode_num_draft_tokens_total") == total("draft_n")
    assert delta("spec_decode_num_accepted_tokens_total") == total("draft_n_accepted")
    assert after["llamacpp:n_tokens_max"][1] >= runs[0]["tokens_evaluated"] + 24
    # the rate over decode steps, as llama-server's (the first token comes with the prompt)
    steps = sum(r["timings"]["predicted_n"] - 1 for r in runs)
    secs = sum(r["timings"]["predicted_ms"] for r in runs) / 1000
    assert after["llamacpp:predicted_tokens_seconds"] == ("gauge", pytest.approx(steps / secs, rel=1e-3))
    again, _, _ = _llama_metrics(url)
    assert again["llamacpp:predicted_tokens_seconds"][1] == 0.0 and again["llamacpp:requests_processing"][1] == 0


def test_timings_per_token_on_native_and_chat_streams(server):
    url, _, _ = server
    body = {
        "prompt": "the quick brown fox jumps over the lazy dog " * 30,
        "n_predict": 6,
        "stream": True,
        "timings_per_token": True,
        "return_progress": True,
        "cache_prompt": False,
    }
    chunks = sse_data(url + "/completion", body)
    progress = [c for c in chunks if "prompt_progress" in c]
    assert len(progress) > 1 and all("timings" in c for c in chunks)
    first = progress[0]["timings"]
    assert first["prompt_n"] == 0 and first["prompt_ms"] == 0.0 and first["predicted_n"] == 0
    ms = [c["timings"]["prompt_ms"] for c in progress]
    assert ms == sorted(ms) and ms[-1] > 0
    assert progress[-1]["timings"]["prompt_n"] == progress[-1]["prompt_progress"]["total"]
    text = [c for c in chunks if c.get("content")]
    counts = [c["timings"]["predicted_n"] for c in text]
    assert counts == sorted(counts) and counts[-1] <= 6 and chunks[-1]["timings"]["predicted_n"] == 6
    chat = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "stream": True}
    plain = sse_data(url + "/v1/chat/completions", chat)
    timed = sse_data(url + "/v1/chat/completions", {**chat, "timings_per_token": True})
    deltas = lambda cs: [c for c in cs if c.get("choices") and c["choices"][0]["delta"].get("content")]  # noqa: E731
    assert deltas(timed) and all("timings" in c for c in deltas(timed))
    assert not any("timings" in c for c in deltas(plain))


def test_host_takes_several_addresses_and_each_serves_with_the_same_key(tiny_dir, tmp_path):
    """llama-server's `--host 127.0.0.1,::1`: one port, every address served, the key checked on each."""
    import socket

    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    proc, url, lines = start_server(
        env, "-m", str(tiny_dir), "--host", "127.0.0.1,::1", "--api-key", "k", "--no-warmup"
    )
    try:
        port = url.rsplit(":", 1)[1]
        assert f"(and http://[::1]:{port})" in lines[-1]
        for base in (url, f"http://[::1]:{port}"):
            assert get(base + "/health")["status"] == "ok"
            assert post(base + "/v1/completions", {"prompt": "Hi", "max_tokens": 2})[0] == 401
            req = urllib.request.Request(
                base + "/v1/completions",
                data=json.dumps({"prompt": "Hi", "max_tokens": 2}).encode(),
                headers={"Content-Type": "application/json", "Authorization": "Bearer k"},
            )
            with urllib.request.urlopen(req, timeout=60) as r:
                assert json.loads(r.read())["usage"]["completion_tokens"] == 2
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    bad = subprocess.run(
        mlxcel_cmd() + ["serve", "-m", str(tiny_dir), "--port", "0", "--host", "127.0.0.1,192.0.2.1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert bad.returncode == 1 and "--host 192.0.2.1" in bad.stderr and "cannot bind" in bad.stderr
    assert "Traceback" not in bad.stderr
