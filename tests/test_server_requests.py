"""The HTTP request layer without a model (#13): FastAPI's TestClient and a fake engine and worker.

Every refusal is a 4xx with the error shape and the server keeps answering; access rules (keys,
Host on loopback, JSON content type, CORS) and the shapes clients rely on. The real-socket tests
with the default model are in test_server.py.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from mlxcel_py import __version__
from mlxcel_py.engine.generation import TokenLogprob
from mlxcel_py.engine.stats import GenerationStats
from mlxcel_py.engine.text import TextPiece
from mlxcel_py.errors import UsageError
from mlxcel_py.options import SamplingOptions
from mlxcel_py.server.app import create_app
from mlxcel_py.server.security import AccessPolicy, CorsPolicy, parse_keys
from mlxcel_py.server.worker import Busy, Result

VOCAB = 300


class _ByteTokens:
    """llguidance's view of FakeTokenizer (a token per byte; the ids past 255 are specials), so
    grammars compile for it as for a real model's tokenizer."""

    eos_token_id, bos_token_id = VOCAB - 1, None
    tokens = [bytes([i]) for i in range(256)] + [f"<t{i}>".encode() for i in range(256, VOCAB)]
    special_token_ids = list(range(256, VOCAB))

    def __call__(self, text):
        return list(text if isinstance(text, bytes) else text.encode())


def _byte_index():
    import llguidance

    from mlxcel_py.engine.grammar import TokenizerIndex

    index = TokenizerIndex.__new__(TokenizerIndex)  # TokenizerIndex.of finds it on the tokenizer
    index.vocab_size, index.ll = VOCAB, llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokens()))
    return index


class FakeTokenizer:
    has_chat_template = False
    _mlxcel_grammar_index = _byte_index()

    def encode(self, text, add_special_tokens=False):
        return [b % VOCAB for b in text.encode()]

    def decode(self, ids):
        return bytes(i % 256 for i in ids).decode("latin-1")

    def get_vocab(self):
        return {str(i): i for i in range(VOCAB)}


from mlxcel_py.engine.gate import Gate  # noqa: E402


class FakeWorker:
    """Answers every job with the prompt's first characters; records what it was asked."""

    def __init__(self, fail: str | None = None, pieces: tuple[str, ...] = ("ok",)):
        self.jobs, self.fail, self.pieces = [], fail, pieces
        self.active = self.queue_depth = 0
        self.parallel = 1
        self.gate = Gate(2)
        self.warmup_error = None
        self.alive = True
        self.full = False

    def admit(self, job):
        if self.full:
            raise Busy("64 requests are waiting")

    async def submit(self, job):
        self.jobs.append(job)
        if self.fail:
            yield "error", self.fail
            return
        lps = [TokenLogprob(5, -0.25, ((5, -0.25), (7, -1.5))[: job.logprobs or 0])] if job.logprobs is not None else []
        if lps:
            yield "logprobs", lps
        for i, text in enumerate(self.pieces):
            yield "text", TextPiece(text, i + 1, (5 + i,))
        n = len(self.pieces)
        stats = GenerationStats(prompt_tokens=len(job.prompt), generated_tokens=n)
        yield "done", Result("".join(self.pieces), [5 + i for i in range(n)], "stop", None, stats, True, lps)


def make_client(
    *,
    worker=None,
    access=AccessPolicy(),
    cors=CorsPolicy(),
    body_limit=65536,
    base_url="http://localhost",
    max_tokens=-1,
    access_log=False,
    slots=True,
):
    tok = FakeTokenizer()
    session = SimpleNamespace(
        tokenizer=tok,
        engine=SimpleNamespace(vocab_size=VOCAB, context_length=512, eos_ids=()),
        target=SimpleNamespace(resolved=SimpleNamespace(path="/m", gguf=None)),
    )
    worker = worker or FakeWorker()
    app = create_app(
        session,
        worker,
        defaults=SamplingOptions(),
        max_tokens=max_tokens,
        model_id="tiny",
        access=access,
        cors=cors,
        body_limit=body_limit,
        access_log=access_log,
        slots=slots,
    )
    return TestClient(app, base_url=base_url, raise_server_exceptions=False), worker


CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


def _assert_error(r, status, fragment):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert fragment in err["message"], err


@pytest.mark.parametrize(
    "body,fragment",
    [
        ({"messages": HI, "n": 17}, "'n': Input should be less than or equal to 16"),
        ({"messages": HI, "n": 0}, "'n': Input should be greater than or equal to 1"),
        ({"messages": HI, "n": 1.0}, "'n': Input should be a valid integer"),
        ({"messages": HI, "n": True}, "'n': Input should be a valid integer"),
        (
            {"messages": HI, "n": 2, "stream": True, "tools": [{"type": "function", "function": {"name": "f"}}]},
            "'n' above 1 with 'tools' is served without 'stream'",
        ),
        ({"messages": HI, "response_format": {"type": "yaml"}}, "'response_format': type must be text, json_object"),
        ({"messages": HI, "response_format": "json"}, "'response_format': type must be text, json_object"),
        ({"messages": HI, "json_schema": [1]}, "'json_schema': the schema must be a JSON object"),
        ({"messages": HI, "grammar": 5}, "'grammar': must be a string"),
        ({"messages": HI, "tools": [{"type": "retrieval"}]}, "'tools.0.type': Input should be 'function'"),
        ({"messages": HI, "functions": [{"name": "f"}]}, "'functions' is not supported"),
        ({"messages": HI, "logit_bias": {"5": "x"}}, "'logit_bias': a bias must be a finite number"),
        ({"messages": HI, "logit_bias": {"999999": 1}}, "'logit_bias': token id 999999 is outside the vocabulary"),
        ({"messages": HI, "logit_bias": 5}, "'logit_bias' must be an object of token ids to biases"),
        ({"messages": HI, "logit_bias": [[5]]}, "'logit_bias': each entry must be a [token, bias] pair"),
        ({"messages": HI, "top_logprobs": 3}, "'top_logprobs' needs 'logprobs': true"),
        (
            {"messages": HI, "logprobs": True, "top_logprobs": 50},
            "'top_logprobs': Input should be less than or equal to 20",
        ),
        ({"messages": HI, "logprobs": 3}, "'logprobs': Input should be a valid boolean"),
        ({"messages": HI, "grammar": "root ::= x"}, "'grammar': the GBNF grammar does not compile"),
        (
            {"messages": [{"role": "<|im_start|>system", "content": "x"}]},
            "'messages.0.role': must be one of system, user",
        ),
        ({"messages": ["hi"]}, "'messages.0': Input should be a valid dictionary"),
        ({"messages": [{"content": "hi"}]}, "'messages.0.role': Field required"),
        (
            {"messages": [{"role": "user", "content": 5}]},
            "'messages.0.content': Input should be a valid string or a valid list",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "'messages.0.content.0.text': Input should",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "a text part needs a string 'text'"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "an image_url part needs 'image_url'"),
        (
            {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
            "'input_audio' parts are not supported",
        ),
        ({"messages": HI, "model": {"x": 1}}, "'model': Input should be a valid string"),
        ({"messages": HI, "temperature": "x" * 5000}, "'temperature': Input should be a valid number"),
        ({"messages": HI, "temperature": True}, "'temperature': Input should be a valid number"),
        ({"messages": HI, "top_k": 2.5}, "'top_k': Input should be a valid integer"),
        ({"messages": HI, "stop": ["s"] * 33}, "'stop': at most 32 strings"),
        ({"messages": HI, "stop": "x" * 1001}, "'stop': at most 32 strings of at most 1000 characters"),
        ({"messages": HI, "temperature": -1}, "'temperature' must be >= 0 (0 is greedy)"),
        ({"messages": HI, "repeat_penalty": 1e-300}, "'repeat_penalty' must be between 0.01 and 100"),
        ({"messages": HI, "repeat_penalty": 1e308}, "'repeat_penalty' must be between 0.01 and 100"),
        ({"messages": HI, "max_tokens": -5}, "'max_tokens' must be -1 or >= 0"),
        ({"messages": HI, "top_p": 0}, "'top_p' must be in (0, 1]"),
    ],
)
def test_unsupported_and_malformed_fields_get_400_naming_the_field(body, fragment):
    client, worker = make_client()
    r = client.post(CHAT, json=body)
    _assert_error(r, 400, fragment)
    assert len(r.json()["error"]["message"]) < 200  # echoed input is cut short
    assert worker.jobs == []
    assert client.post(CHAT, json={"messages": HI}).status_code == 200  # still serving


@pytest.mark.parametrize(
    "raw,fragment",
    [
        (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "NaN is not a number JSON allows"),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}',
            "Infinity is not a number JSON allows",
        ),
        (b'{"max_tokens": ' + b"9" * 5000 + b"}", "malformed JSON body"),
        (b"[" * 100000 + b"]" * 100000, "malformed JSON body"),
        (b'{"model": "\\ud800", "messages": [{"role": "user", "content": "\\udfff"}]}', None),
        (b"\xff\xfe not utf-8", "malformed JSON body"),
    ],
)
def test_hostile_json_gets_a_4xx_never_a_500(raw, fragment):
    client, _ = make_client(body_limit=10**6)
    r = client.post(CHAT, content=raw, headers={"Content-Type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    if fragment:
        assert fragment in r.json()["error"]["message"]
    assert client.get("/health").status_code == 200


def test_body_limit_gives_413_with_and_without_content_length():
    client, worker = make_client(body_limit=1000)
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 2000}]})
    r = client.post(CHAT, content=big, headers={"Content-Type": "application/json"})
    _assert_error(r, 413, "larger than 1000 bytes")

    def chunks():  # chunked transfer: no Content-Length to check up front
        for i in range(0, len(big), 100):
            yield big[i : i + 100].encode()

    r = client.post(CHAT, content=chunks(), headers={"Content-Type": "application/json"})
    _assert_error(r, 413, "larger than 1000 bytes")
    assert worker.jobs == []


def test_any_model_name_is_served_and_responses_carry_a_fingerprint():
    client, worker = make_client()
    r = client.post(CHAT, json={"model": "gpt-3.5-turbo", "messages": HI})
    assert r.status_code == 200
    body = r.json()
    assert body["model"] == "tiny" and body["system_fingerprint"].startswith("b")
    r = client.post("/v1/completions", json={"model": "text-davinci-003", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["system_fingerprint"] == body["system_fingerprint"]


def test_developer_role_is_rendered_as_system():
    client, worker = make_client()
    r = client.post(CHAT, json={"messages": [{"role": "developer", "content": "be brief"}] + HI})
    assert r.status_code == 200
    assert FakeTokenizer().decode(worker.jobs[0].prompt).startswith("System: be brief")


def test_api_keys_bearer_any_case_x_api_key_and_public_routes():
    client, _ = make_client(access=AccessPolicy(api_keys=("k1", "k2")))
    assert client.post("/tokenize", json={"content": "a"}).status_code == 401
    r = client.post("/tokenize", json={"content": "a"}, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json() == {
        "error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}
    }
    for headers in (
        {"Authorization": "Bearer k1"},
        {"Authorization": "bearer k2"},
        {"authorization": "BEARER k1"},
        {"X-Api-Key": "k2"},
        {"X-Api-Key": "", "Authorization": "Bearer k1"},  # an empty key header does not hide the token
        {"X-Api-Key": "wrong", "Authorization": "Bearer k1"},
    ):
        assert client.post("/tokenize", json={"content": "a"}, headers=headers).status_code == 200, headers
    assert client.post("/tokenize", json={"content": "a"}, headers={"Authorization": "Basic k1"}).status_code == 401
    assert client.post("/tokenize", json={"content": "a"}, headers={"X-Api-Key": " "}).status_code == 401
    for path in ("/health", "/v1/models", "/models"):
        assert client.get(path).status_code == 200, path


def test_parse_keys_from_flags_and_file(tmp_path):
    f = tmp_path / "keys"
    f.write_text("# team keys\nk3\n\n  k4  \n")
    assert parse_keys(["k1,k2", "k1"], str(f)) == ("k1", "k2", "k3", "k4")
    from mlxcel_py.errors import UsageError

    with pytest.raises(UsageError, match="--api-key-file .*: no such file"):
        parse_keys([], str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(UsageError, match="no key in it"):
        parse_keys([], str(tmp_path / "empty"))


def test_cross_site_simple_posts_are_refused_and_curl_bodies_are_read_as_json():
    client, worker = make_client(cors=CorsPolicy(("https://ok.example",)))
    # a web page can send these cross-site without a preflight; they must not reach the model
    site = {"Origin": "https://evil.example"}
    r = client.post(CHAT, content=json.dumps({"messages": HI}), headers={"Content-Type": "text/plain", **site})
    _assert_error(r, 403, "--cors-origins")
    r = client.post(CHAT, data={"messages": "hi"}, headers=site)  # form-encoded
    assert r.status_code == 403 and worker.jobs == []
    r = client.post(CHAT, json={"messages": HI}, headers=site)  # JSON too (a browser would preflight it)
    assert r.status_code == 403 and worker.jobs == []
    assert client.get("/health", headers=site).status_code == 200  # a GET reads nothing the page can see
    # curl -d (form content type, no Origin) and a page on an allowed origin: read as JSON
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    assert client.post(CHAT, content=json.dumps({"messages": HI}), headers=form).status_code == 200
    ok = {"Content-Type": "text/plain", "Origin": "https://ok.example"}
    assert client.post(CHAT, content=json.dumps({"messages": HI}), headers=ok).status_code == 200
    assert len(worker.jobs) == 2
    r = client.post(CHAT, data={"messages": "hi"})  # a real form body is not JSON: a 400, not a 415
    _assert_error(r, 400, "malformed JSON")


def test_loopback_server_refuses_foreign_host_headers():
    client, _ = make_client(access=AccessPolicy(loopback_only_hosts=True), base_url="http://evil.example")
    _assert_error(client.get("/health"), 403, "Host header")
    for host in ("localhost:8080", "127.0.0.1", "[::1]:8080", "127.0.0.2:1"):
        client, _ = make_client(access=AccessPolicy(loopback_only_hosts=True), base_url=f"http://{host}")
        assert client.get("/health").status_code == 200, host
    client, _ = make_client(access=AccessPolicy(loopback_only_hosts=False), base_url="http://my-server.lan")
    assert client.get("/health").status_code == 200


PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"}


@pytest.mark.parametrize(
    "origin,header,value",
    [  # llama-server's own preflight cases (tools/server/tests/unit/test_security.py), behind a key
        ("localhost", "Access-Control-Allow-Origin", "localhost"),
        ("web.mydomain.fr", "Access-Control-Allow-Origin", "web.mydomain.fr"),
        ("origin", "Access-Control-Allow-Credentials", "true"),
        ("web.mydomain.fr", "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS"),
        ("web.mydomain.fr", "Access-Control-Allow-Headers", "*"),
    ],
)
def test_cors_star_answers_preflights_as_llama_server_before_the_key_check(origin, header, value):
    client, worker = make_client(access=AccessPolicy(api_keys=("k",)), cors=CorsPolicy.parse("*", None, None, True))
    r = client.options("/completions", headers={"Origin": origin, **PREFLIGHT})
    assert r.status_code == 200 and r.headers[header] == value
    # the real request still needs its key, and an allowed origin is reflected on its answer too
    r = client.post(CHAT, json={"messages": HI}, headers={"Origin": "https://app.example"})
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == "https://app.example"
    r = client.post(CHAT, json={"messages": HI}, headers={"Origin": "https://app.example", "X-Api-Key": "k"})
    assert r.status_code == 200 and r.headers["access-control-allow-credentials"] == "true"
    assert len(worker.jobs) == 1


def test_cors_origins_localhost_means_any_loopback_origin_and_refusals_get_no_header():
    policy = CorsPolicy.parse("localhost, https://app.example", None, "Authorization, Content-Type", False)
    client, worker = make_client(cors=policy)
    for origin in (
        "http://localhost:5173",
        "http://127.0.0.1:8080",
        "https://localhost",
        "http://[::1]:3000",
        "https://app.example",
        "HTTPS://APP.EXAMPLE/",
    ):
        r = client.options(CHAT, headers={"Origin": origin, **PREFLIGHT})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin, origin
        assert r.headers["access-control-allow-headers"] == "Authorization, Content-Type"
        assert (
            r.headers["access-control-allow-credentials"] == "false"
        )  # --no-cors-credentials, as llama-server says it
    for origin in (
        "https://evil.example",
        "http://localhost.evil.example",
        "http://10.0.0.1:8080",
        "https://app.example.evil",
        "null",
    ):
        r = client.options(CHAT, headers={"Origin": origin, **PREFLIGHT})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers, origin
        # llama-server's preflight lists its methods and headers whatever the origin: without the
        # origin reflected, the browser still refuses the call
        assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
        # a simple cross-site POST from a refused origin never reaches the model
        r = client.post(
            CHAT, content=json.dumps({"messages": HI}), headers={"Origin": origin, "Content-Type": "text/plain"}
        )
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    assert worker.jobs == []
    # no origin at all: CORS off, and every browser origin is foreign
    client, _ = make_client(cors=CorsPolicy.parse("", None, None, True))
    r = client.options(CHAT, headers={"Origin": "http://localhost:5173", **PREFLIGHT})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    assert CorsPolicy.parse("none", None, None, True).origins == ()
    assert CorsPolicy.parse(None, "get,post,delete", None, True).methods == "GET, POST, DELETE"
    with pytest.raises(UsageError, match="--cors-origins"):
        CorsPolicy.parse("https://a.example, not an origin", None, None, True)


def test_no_slots_answers_501_as_llama_server():
    client, _ = make_client(slots=False)
    r = client.get("/slots")
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
    client, _ = make_client()
    assert client.get("/slots").status_code != 501


def test_worker_failures_return_a_request_id_not_the_exception_text(capfd):
    client, _ = make_client(worker=FakeWorker(fail="RuntimeError: /secret/path/model.safetensors is corrupt"))
    r = client.post(CHAT, json={"messages": HI})
    assert r.status_code == 500
    msg = r.json()["error"]["message"]
    assert "request id" in msg and "secret" not in msg
    rid = msg.split("request id ")[1].rstrip(")")
    assert rid in capfd.readouterr().err  # the details are in the server's log, under that id


def test_a_dead_worker_makes_health_503_and_requests_fail_fast():
    worker = FakeWorker()
    worker.alive = False
    worker.warmup_error = "out of memory"
    client, _ = make_client(worker=worker)
    r = client.get("/health")
    assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"
    assert "warmup failed: out of memory" in r.json()["error"]["message"]
    r = client.post(CHAT, json={"messages": HI})
    assert r.status_code == 503 and worker.jobs == []
    r = client.post(CHAT, json={"messages": HI, "stream": True})
    assert r.status_code == 503


def test_fuzzed_bodies_never_get_a_5xx():
    """Property-based: bodies built from every field the routes read, with values of any JSON type
    (and the right types, out of range), for every POST route. Zero 5xx; health answers after."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    fields = [
        "messages",
        "prompt",
        "content",
        "tokens",
        "model",
        "max_tokens",
        "n_predict",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "repeat_penalty",
        "stop",
        "stream",
        "n",
        "response_format",
        "json_schema",
        "grammar",
        "tool_choice",
        "logprobs",
        "n_probs",
        "add_special",
        "tools",
        "logit_bias",
    ]
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
    )
    anything = st.recursive(
        scalars,
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
        max_leaves=12,
    )
    message = st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "system", "assistant", "bogus"]) | anything,
            "content": st.text(max_size=30) | anything,
        }
    )
    values = {
        "messages": st.lists(message | anything, max_size=3) | anything,
        "prompt": st.text(max_size=30) | st.lists(st.integers(-5, 400), max_size=5) | anything,
        "tokens": st.lists(st.integers(-5, 10**12), max_size=5) | anything,
    }
    body = st.dictionaries(st.sampled_from(fields), anything, max_size=6).flatmap(
        lambda d: st.fixed_dictionaries({k: values.get(k, anything) for k in d})
    )
    routes = ["/v1/chat/completions", "/v1/completions", "/completion", "/tokenize", "/detokenize"]
    client, _ = make_client()

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(route=st.sampled_from(routes), payload=body)
    def check(route, payload):
        r = client.post(route, json=payload)
        assert r.status_code < 500, (route, payload, r.text)
        if r.status_code >= 400:
            assert set(r.json()["error"]) >= {"message", "type"}

    check()
    assert client.get("/health").status_code == 200


def test_server_n_predict_is_the_default_a_request_overrides_and_the_access_log(capfd):
    """llama-server's -n: the budget of a request that sets none (or -1); a request's own wins."""
    client, worker = make_client(max_tokens=5, access_log=True)
    for asked, got in ((100, 100), (None, 5), (3, 3), (-1, 5)):
        body = {"messages": HI} if asked is None else {"messages": HI, "max_tokens": asked}
        assert client.post(CHAT, json=body).status_code == 200
        assert worker.jobs[-1].max_tokens == got, asked
    assert client.post("/completion", json={"prompt": "hi", "n_predict": 50}).status_code == 200
    assert worker.jobs[-1].max_tokens == 50
    err = capfd.readouterr().err
    assert "POST /v1/chat/completions 200 1 tokens" in err and " ms" in err


def test_a_full_queue_answers_503_with_retry_after():
    worker = FakeWorker()
    worker.full = True
    client, _ = make_client(worker=worker)
    for stream in (False, True):
        r = client.post(CHAT, json={"messages": HI, "stream": stream})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "the server is busy (64 requests are waiting)" in r.json()["error"]["message"]
    assert worker.jobs == []


def test_tokenize_with_pieces_and_completion_return_tokens():
    client, _ = make_client()
    r = client.post("/tokenize", json={"content": "hi", "with_pieces": True})
    assert r.json() == {"tokens": [{"id": 104, "piece": "h"}, {"id": 105, "piece": "i"}]}
    assert client.post("/tokenize", json={"content": "hi"}).json() == {"tokens": [104, 105]}
    r = client.post("/completion", json={"prompt": "hi", "n_predict": 2, "return_tokens": True})
    assert r.json()["tokens"] == [5]
    assert client.post("/completion", json={"prompt": "hi", "n_predict": 2}).json()["tokens"] == []


def test_logprobs_in_each_api_shape():
    client, worker = make_client()
    r = client.post(CHAT, json={"messages": HI, "logprobs": True, "top_logprobs": 2}).json()
    entry = r["choices"][0]["logprobs"]["content"][0]
    assert entry["token"] == "\x05" and entry["logprob"] == -0.25 and entry["bytes"] == [5]
    assert [t["logprob"] for t in entry["top_logprobs"]] == [-0.25, -1.5]
    assert worker.jobs[-1].logprobs == 2
    r = client.post(CHAT, json={"messages": HI}).json()
    assert r["choices"][0]["logprobs"] is None and worker.jobs[-1].logprobs is None
    r = client.post("/v1/completions", json={"prompt": "hi", "logprobs": 1}).json()
    assert r["choices"][0]["logprobs"] == {
        "tokens": ["\x05"],
        "token_logprobs": [-0.25],
        "top_logprobs": [{"\x05": -0.25}],
        "text_offset": [0],
    }
    r = client.post("/completion", json={"prompt": "hi", "n_probs": 2}).json()
    assert r["completion_probabilities"][0]["id"] == 5 and len(r["completion_probabilities"][0]["top_logprobs"]) == 2
    assert "completion_probabilities" not in client.post("/completion", json={"prompt": "hi"}).json()
    frames = [
        json.loads(x[6:])
        for x in client.post(CHAT, json={"messages": HI, "logprobs": True, "stream": True}).text.split("\n\n")
        if x.startswith("data: {")
    ]
    assert frames[1]["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.25


def test_server_default_sampling_flag_then_generation_config_then_llama_server(tmp_path):
    from mlxcel_py.server.main import server_sampling

    flags = SamplingOptions(temp=0.3)
    assert server_sampling(flags, (), tmp_path) == SamplingOptions(temp=0.8, top_p=0.95, top_k=40, min_p=0.05)
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_k": 20, "top_p": "x"}))
    s = server_sampling(flags, ("temp",), tmp_path)
    assert (s.temp, s.top_k, s.top_p, s.min_p) == (0.3, 20, 0.95, 0.05)  # flag, config, default, default
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    assert server_sampling(flags, (), tmp_path).temp == 0.0  # a checkpoint that asks for greedy decoding


def test_while_loading_every_route_answers_503_then_serves():
    from mlxcel_py.server.context import ServerContext

    app = create_app(access=AccessPolicy())
    client = TestClient(app, base_url="http://localhost", raise_server_exceptions=False)
    r = client.get("/health")
    assert r.status_code == 503 and r.json() == {
        "error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}
    }
    r = client.post(CHAT, json={"messages": HI})
    assert r.status_code == 503 and r.json()["error"]["message"] == "Loading model"
    assert client.get("/v1/models").status_code == 503
    engine = SimpleNamespace(vocab_size=VOCAB, context_length=512, eos_ids=())
    app.state.ctx = ServerContext(FakeTokenizer(), engine, FakeWorker(), SamplingOptions(), -1, "tiny")
    assert client.get("/health").status_code == 200
    assert client.post(CHAT, json={"messages": HI}).status_code == 200


def test_logit_bias_in_openai_and_llama_server_forms_reaches_the_job():
    client, worker = make_client()
    r = client.post(CHAT, json={"messages": HI, "logit_bias": {"5": 10, "7": -100}})
    assert r.status_code == 200
    assert worker.jobs[-1].sampling.logit_bias == ((5, 10.0), (7, -100.0))
    r = client.post("/completion", json={"prompt": "x", "logit_bias": [["hi", False], [9, 1.5]]})
    assert r.status_code == 200, r.text
    hi = FakeTokenizer().encode("hi")
    assert worker.jobs[-1].sampling.logit_bias == tuple((t, float("-inf")) for t in hi) + ((9, 1.5),)
    r = client.post(CHAT, json={"messages": HI, "logit_bias": {"²": 1}})  # a digit int() refuses: text
    assert r.status_code == 200, r.text
    assert worker.jobs[-1].sampling.logit_bias == tuple((t, 1.0) for t in FakeTokenizer().encode("²"))


def _sse(r) -> list[dict]:
    return [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: ") and ln != "data: [DONE]"]


def test_n_choices_are_decoded_side_by_side_with_their_own_seeds():
    client, worker = make_client()
    r = client.post(CHAT, json={"messages": HI, "n": 3, "seed": 7, "temperature": 0.9})
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [j.sampling.seed for j in worker.jobs] == [7, 8, 9]
    assert body["usage"]["prompt_tokens"] == len(worker.jobs[0].prompt)  # the prompt counted once
    assert body["usage"]["completion_tokens"] == 3
    frames = _sse(
        client.post(CHAT, json={"messages": HI, "n": 2, "stream": True, "stream_options": {"include_usage": True}})
    )
    heads = [f for f in frames if f["choices"] and f["choices"][0]["delta"].get("role")]
    assert sorted(f["choices"][0]["index"] for f in heads) == [0, 1]
    text = {0: "", 1: ""}
    for f in frames:
        for c in f["choices"]:
            text[c["index"]] += c["delta"].get("content") or ""
    assert text == {0: "ok", 1: "ok"}
    assert frames[-1]["choices"] == [] and frames[-1]["usage"]["completion_tokens"] == 2
    r = client.post("/v1/completions", json={"prompt": ["ab", "cd"], "n": 2})
    assert [c["index"] for c in r.json()["choices"]] == [0, 1, 2, 3]
    assert [j.prompt for j in worker.jobs[-4:]] == [[97, 98], [97, 98], [99, 100], [99, 100]]


def test_prompt_forms_batches_mixed_sequences_and_prompt_string_objects():
    client, worker = make_client()
    one = client.post("/completion", json={"prompt": [1, 2, "ab", 3]}).json()
    assert isinstance(one, dict) and worker.jobs[-1].prompt == [1, 2, 97, 98, 3]
    batch = client.post("/completion", json={"prompt": [[1, 2], "ab", {"prompt_string": "cd"}]}).json()
    assert isinstance(batch, list) and [b["index"] for b in batch] == [0, 1, 2]
    assert [j.prompt for j in worker.jobs[-3:]] == [[1, 2], [97, 98], [99, 100]]
    assert client.post("/completion", json={"prompt": ["ab", "cd"]}).json()[1]["content"] == "ok"
    single = client.post("/completion", json={"prompt": {"prompt_string": "xy"}}).json()
    assert isinstance(single, dict) and worker.jobs[-1].prompt == [120, 121]
    _assert_error(
        client.post("/completion", json={"prompt": {"prompt_string": "x", "multimodal_data": ["AAAA"]}}),
        400,
        "this model takes text only",
    )
    _assert_error(client.post("/completion", json={"prompt": []}), 400, "'prompt' must not be empty")
    n_jobs = len(worker.jobs)
    _assert_error(client.post("/completion", json={"prompt": "x", "response_fields": [5]}), 400, "'response_fields'")
    r = client.post("/completion", json={"prompt": {"prompt_string": 5}})
    _assert_error(r, 400, "'prompt.prompt_string': Input should be a valid string")
    assert len(worker.jobs) == n_jobs  # refused before any decoding
    _assert_error(client.post("/completion", json={"prompt": ["a"] * 17}), 400, "at most 16 prompts")
    _assert_error(client.post("/completion", json={"prompt": [1, 999999]}), 400, "token ids must be integers")
    fields = client.post(
        "/completion",
        json={"prompt": "ab", "n_predict": 4, "response_fields": ["content", "generation_settings/n_predict"]},
    ).json()
    assert fields == {"content": "ok", "generation_settings/n_predict": 4}


def test_native_stream_frames_carry_their_tokens_and_the_last_the_generation_settings():
    client, worker = make_client(worker=FakeWorker(pieces=("a", "b", "c")))
    frames = _sse(client.post("/completion", json={"prompt": "hi", "stream": True, "n_predict": 9, "seed": 42}))
    assert [f["tokens"] for f in frames[:-1]] == [[5], [6], [7]]
    last = frames[-1]
    assert last["stop"] is True and last["generation_settings"]["n_predict"] == 9
    assert last["generation_settings"]["seed"] == 42 and last["generation_settings"]["stream"] is True
    r = client.post("/completion", json={"prompt": "hi", "logit_bias": [[5, False]]}).json()
    assert (
        r["generation_settings"]["logit_bias"] == [{"bias": None, "token": 5}]
        and r["generation_settings"]["seed"] == 4294967295
    )
    frames = _sse(client.post("/completion", json={"prompt": ["x", "y"], "stream": True}))
    assert sorted({f["index"] for f in frames}) == [0, 1] and sum(f["stop"] for f in frames) == 2


def test_token_counts_and_apply_template_render_what_the_chat_route_would():
    client, worker = make_client()
    n = client.post("/v1/chat/completions/input_tokens", json={"messages": HI}).json()["input_tokens"]
    client.post(CHAT, json={"messages": HI})
    assert n == len(worker.jobs[-1].prompt) and n > 2
    assert client.post("/chat/completions/input_tokens", json={"messages": HI}).json() == {"input_tokens": n}
    text = client.post("/apply-template", json={"messages": HI}).json()["prompt"]
    assert "hi" in text and len(text) == n  # the fake tokenizer is one id per byte
    r = client.post("/v1/responses/input_tokens", json={"input": "hi"}).json()
    assert r["object"] == "response.input_tokens" and r["input_tokens"] > 0
    _assert_error(client.post("/v1/chat/completions/input_tokens", json={"messages": []}), 400, "'messages'")


WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def test_a_streamed_tool_call_comes_in_openai_pieces_after_live_text():
    pieces = (
        "Let me check. ",
        "<tool_",
        'call>\n{"name": "get_weather", "arguments": {"ci',
        'ty": "Paris, ',
        'the capital of France"}}\n</tool_call>',
    )
    client, _ = make_client(worker=FakeWorker(pieces=pieces))
    frames = _sse(client.post(CHAT, json={"messages": HI, "tools": WEATHER, "stream": True}))
    deltas = [c["delta"] for f in frames for c in f["choices"]]
    assert deltas[1] == {"content": "Let me check. "}  # the text before the call went out as it came
    parts = [t for d in deltas for t in d.get("tool_calls", [])]
    assert parts[0]["function"] == {"name": "get_weather", "arguments": ""} and parts[0]["id"].startswith("call_")
    # under the tools' grammar the call goes out as it is decoded: its name once its arguments
    # begin, then each piece's share of them
    assert [p["function"]["arguments"] for p in parts[1:]] == ['{"ci', 'ty": "Paris, ', 'the capital of France"}']
    assert json.loads("".join(p["function"]["arguments"] for p in parts)) == {"city": "Paris, the capital of France"}
    assert frames[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # a reply without a call streams as text, even one that starts like a tag
    client, _ = make_client(worker=FakeWorker(pieces=("<b>", "bold</b> ", "done")))
    frames = _sse(client.post(CHAT, json={"messages": HI, "tools": WEATHER, "stream": True}))
    text = "".join(c["delta"].get("content") or "" for f in frames for c in f["choices"])
    assert text == "<b>bold</b> done" and frames[-1]["choices"][0]["finish_reason"] == "stop"


def test_reasoning_format_legacy_keeps_the_tags_and_verbose_shows_the_prompt():
    client, _ = make_client(worker=FakeWorker(pieces=("<think>hm", "m</think>", "yes")))
    m = client.post(CHAT, json={"messages": HI, "reasoning_format": "deepseek-legacy"}).json()["choices"][0]["message"]
    assert m["reasoning_content"] == "hmm" and m["content"] == "<think>hmm</think>yes"
    m = client.post(CHAT, json={"messages": HI}).json()["choices"][0]["message"]
    assert m["reasoning_content"] == "hmm" and m["content"] == "yes"
    frames = _sse(client.post(CHAT, json={"messages": HI, "reasoning_format": "deepseek-legacy", "stream": True}))
    ds = [c["delta"] for f in frames for c in f["choices"]]
    assert "".join(d.get("content") or "" for d in ds) == "<think>hmm</think>yes"
    assert "".join(d.get("reasoning_content") or "" for d in ds) == "hmm"
    body = client.post(CHAT, json={"messages": HI, "verbose": True}).json()
    assert "hi" in body["__verbose"]["prompt"] and body["__verbose"]["generation_settings"]["n_predict"] == -1
    _assert_error(client.post(CHAT, json={"messages": HI, "reasoning_format": "r1"}), 400, "deepseek-legacy")


def test_a_trailing_assistant_turn_is_a_prefill_the_reply_continues():
    client, worker = make_client()
    prefill = HI + [{"role": "assistant", "content": "Whill"}]
    assert client.post(CHAT, json={"messages": prefill}).status_code == 200
    assert bytes(worker.jobs[-1].prompt).decode().endswith("Assistant: Whill")  # left open, no turn after it
    r = client.post(CHAT, json={"messages": prefill + [{"role": "assistant", "content": "again"}]})
    _assert_error(r, 400, "Cannot have 2 or more assistant messages at the end of the list")
    # Anthropic's prefill is the same thing
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Whill"}],
    }
    assert client.post("/v1/messages", json=body).status_code == 200
    assert bytes(worker.jobs[-1].prompt).decode().endswith("Assistant: Whill")


def test_default_cors_lets_only_this_machines_pages_and_the_servers_own_page_call_it():
    # any web page could drive a keyless server with llama-server's default (every origin reflected)
    client, worker = make_client(base_url="http://my-server.lan:8080")
    body = json.dumps({"messages": HI})
    for origin in ("https://evil.example", "http://my-server.lan:9999", "null", "http://localhost.evil.example"):
        r = client.options(CHAT, headers={"Origin": origin, **PREFLIGHT})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers, origin
        r = client.post(CHAT, content=body, headers={"Origin": origin, "Content-Type": "text/plain"})
        _assert_error(r, 403, "--cors-origins")
    assert worker.jobs == []
    # the chat page served by this server (its Origin names the Host), and pages on loopback
    for origin in ("http://my-server.lan:8080", "http://localhost:5173", "http://127.0.0.1:8080"):
        r = client.post(CHAT, content=body, headers={"Origin": origin, "Content-Type": "application/json"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin, origin
    assert len(worker.jobs) == 3
    assert CorsPolicy().origins == ("localhost",) and CorsPolicy.parse(None, None, None, True).origins == ("localhost",)


def test_logit_bias_over_its_limits_is_refused_naming_the_limit():
    client, worker = make_client(body_limit=2**20)
    r = client.post(CHAT, json={"messages": HI, "logit_bias": {str(i % VOCAB): 1 for i in range(5000)}})
    assert r.status_code == 200  # a JSON object's repeated keys collapse: 300 entries
    r = client.post(CHAT, json={"messages": HI, "logit_bias": [[i % VOCAB, 1] for i in range(4097)]})
    _assert_error(r, 400, "4097 entries; the limit is 4096")
    r = client.post(CHAT, json={"messages": HI, "logit_bias": [["x" * 40000, 1], ["y" * 30000, 1]]})
    _assert_error(r, 400, "70000 characters of text; the limit is 65536")
    assert len(worker.jobs) == 1


def test_the_chat_pages_assets_are_public_and_typed_and_the_page_loads_only_them():
    """llama-server serves its web UI's static assets without the key (llama.cpp #21229)."""
    client, _ = make_client(access=AccessPolicy(api_keys=("s3cret",)))
    page = client.get("/", headers={"Accept": "text/html"})
    assert page.status_code == 200 and '<script src="/bundle.js"></script>' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"] and "<script>" not in page.text
    assert '<link rel="manifest" href="/manifest.webmanifest">' in page.text
    for path, kind, marker in (
        ("/bundle.js", "text/javascript", "loadProps"),
        ("/bundle.css", "text/css", "--accent"),
        ("/sw.js", "text/javascript", "registration.unregister()"),  # removes llama-server's cached worker
        ("/manifest.webmanifest", "application/manifest+json", '"start_url": "/"'),
        ("/_app/version.json", "application/json", __version__),  # llama.cpp's test_security.py lists all four
    ):
        r = client.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind) and marker in r.text, path
    assert json.loads(client.get("/manifest.webmanifest").text)["name"]
    assert client.post("/completion", json={"prompt": "hi"}).status_code == 401  # the key still guards the API
