"""serve with LoRA adapters, as llama-server's test_lora.py drives it: GET/POST /lora-adapters, a
request's own `lora` scales (requests under different scales decoded side by side), a prompt cache
that never hands one set of scales' prefix to another, and hostile `lora` values refused with a
400 while the server keeps serving. Every reply is checked against `mlxcel generate` with the same
adapters at the same scales (the real server, over sockets; the tiny GGUF of test_adapters)."""

from __future__ import annotations

import json
import os
import threading

import pytest
from test_adapters import PROMPT, _gen, gguf_pair  # noqa: F401 (a fixture)
from test_server import get, post, start_server

N = 40


@pytest.fixture(scope="module")
def server(gguf_pair, tmp_path_factory):  # noqa: F811
    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path_factory.mktemp("cfg")))
    proc, url, lines = start_server(
        env,
        "-m",
        str(gguf_pair["base"]),
        "--lora",
        f"{gguf_pair['a']},{gguf_pair['b']}",
        "--lora-init-without-apply",
        "-np",
        "4",
    )
    yield url, lines, env, gguf_pair
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def texts(server):
    """What `mlxcel generate` says at each set of scales (less the newline it ends its output with)."""
    _, _, env, pair = server
    a, b, base = str(pair["a"]), str(pair["b"]), pair["base"]
    said = {
        (0, 0): _gen(env, base),
        (1, 0): _gen(env, base, "--lora", a),
        (1, 1): _gen(env, base, "--lora", a, "--lora", b),
        (0.5, 0): _gen(env, base, "--lora-scaled", f"{a}:0.5"),
    }
    assert len(set(said.values())) == len(said)  # four sets of scales, four different texts
    return {k: v.removesuffix("\n") for k, v in said.items()}


def _complete(url: str, lora=None, prompt: str = PROMPT) -> tuple[int, dict]:
    body = {"prompt": prompt, "n_predict": N, "temperature": 0.0}
    if lora is not None:
        body["lora"] = lora
    return post(url + "/completion", body)


def _lora(scales) -> list[dict]:
    return [{"id": i, "scale": s} for i, s in enumerate(scales)]


def test_adapters_are_listed_at_their_startup_scales(server):
    url, lines, _, pair = server
    listed = get(url + "/lora-adapters")
    assert listed == [
        {"id": 0, "path": str(pair["a"]), "scale": 0.0, "task_name": "style", "prompt_prefix": ""},
        {"id": 1, "path": str(pair["b"]), "scale": 0.0, "task_name": "", "prompt_prefix": ""},
    ]
    assert any("/lora-adapters" in ln for ln in lines)


def test_requests_under_different_scales_decode_side_by_side(server, texts):
    url = server[0]
    asked = [(0, 0), (1, 0), (1, 1), (0.5, 0), (1, 0), None]
    out: list = [None] * len(asked)

    def one(i):
        out[i] = _complete(url, None if asked[i] is None else _lora(asked[i]))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(asked))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for scales, (status, body) in zip(asked, out):
        assert status == 200, body
        # no `lora`: the server's scales (0 at startup, --lora-init-without-apply)
        assert body["content"] == texts[scales or (0, 0)], scales


def test_post_sets_the_scales_a_request_without_lora_gets(server, texts):
    url = server[0]
    try:
        status, body = post(url + "/lora-adapters", [{"id": 0, "scale": 1.0}])
        assert (status, body) == (200, {"success": True})
        assert [e["scale"] for e in get(url + "/lora-adapters")] == [1.0, 0.0]  # an adapter not listed: 0
        assert _complete(url)[1]["content"] == texts[(1, 0)]
        assert _complete(url, [])[1]["content"] == texts[(0, 0)]  # a request's empty list: every scale 0
    finally:
        post(url + "/lora-adapters", [])
    assert _complete(url)[1]["content"] == texts[(0, 0)]


def test_a_cached_prefix_is_reused_only_under_its_own_scales(server, texts):
    url = server[0]
    prompt = PROMPT + " the dog sat on the log."
    first = _complete(url, _lora((1, 0)), prompt)[1]
    base = _complete(url, _lora((0, 0)), prompt)[1]
    again = _complete(url, _lora((1, 0)), prompt)[1]
    assert base["content"] != first["content"]  # not the adapted model's cached prefix
    assert again["content"] == first["content"]
    assert again["timings"]["cache_n"] > 0  # its own scales' prefix was kept


def test_the_openai_client_passes_lora_in_extra_body(server):
    from openai import OpenAI

    url, _, env, pair = server
    client = OpenAI(base_url=url + "/v1", api_key="none")

    def chat(lora):
        r = client.chat.completions.create(
            model="x",
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=N,
            temperature=0,
            extra_body={"lora": lora},
        )
        return r.choices[0].message.content

    adapted = chat(_lora((1, 0)))
    assert adapted != chat(_lora((0, 0)))
    assert adapted == _gen(env, pair["base"], "--lora", str(pair["a"]), chat=True).removesuffix("\n")


@pytest.mark.parametrize(
    "lora, message",
    [
        ("x", "'lora' must be an array"),
        ([1, 2], "'lora' must be an array"),
        ([{"id": 7, "scale": 1}], "invalid adapter id 7"),
        ([{"id": "0", "scale": 1}], "invalid adapter id '0'"),
        ([{"id": True, "scale": 1}], "invalid adapter id True"),
        ([{"id": 0, "scale": "big"}], "'scale' must be a finite number"),
        ([{"id": 0, "scale": 1e400}], "'scale' must be a finite number"),  # JSON's 1e400 reads as infinity
        ([{"id": 0, "scale": 1}] * 2000, "the limit is 1024"),
    ],
)
def test_hostile_lora_values_are_400s_and_the_server_keeps_serving(server, texts, lora, message):
    url = server[0]

    def raw(body) -> bytes:
        return json.dumps(body).replace("Infinity", "1e400").encode()

    status, body = post(url + "/completion", raw({"prompt": "x", "n_predict": 2, "lora": lora}))
    assert status == 400 and message in body["error"]["message"], body
    if isinstance(lora, list) and all(isinstance(e, dict) for e in lora):  # the same list as the server's scales
        status, body = post(url + "/lora-adapters", raw(lora))
        assert status == 400 and message in body["error"]["message"], body
    assert [e["scale"] for e in get(url + "/lora-adapters")] == [0.0, 0.0]
    assert _complete(url)[1]["content"] == texts[(0, 0)]


def test_post_lora_adapters_takes_an_array_only(server):
    url = server[0]
    for body in (b"{}", b'"x"', b"[", b"[" * 100000):
        status, reply = post(url + "/lora-adapters", body)
        assert status == 400, reply
    assert [e["scale"] for e in get(url + "/lora-adapters")] == [0.0, 0.0]


def test_kept_fused_models_never_drop_the_startup_one_or_one_in_use():
    from types import SimpleNamespace

    from mlxcel_py.server.adapter_variants import KEEP, AdapterVariants

    class Engine:
        released = False

        def release(self):
            self.released = True

    startup = Engine()
    loaded: dict = {}
    adapters = [SimpleNamespace(spec=SimpleNamespace(path="a.gguf", scale=0.0), task_name="", prompt_prefix="")]
    v = AdapterVariants(adapters, startup, lambda s: loaded.setdefault(s, Engine()))
    assert v.engine((0.0,), set()) is startup and v.loads == 0
    one = v.engine((1.0,), set())
    assert v.engine((1.0,), set()) is one and v.loads == 1  # kept, not loaded again
    v.engine((2.0,), set())
    assert KEEP == 3 and v.kept() == [(0.0,), (1.0,), (2.0,)]
    v.engine((3.0,), busy={id(one)})  # (1.0,)'s engine serves a live request: (2.0,) goes instead
    assert v.kept() == [(0.0,), (1.0,), (3.0,)] and loaded[(2.0,)].released and not one.released
    assert v.engine((-0.0,), set()) is startup  # -0 and 0 are one set of scales
    v.release()  # falling asleep: only the startup engine stays (the resident releases it)
    assert v.kept() == [(0.0,)] and one.released and not startup.released


def test_asleep_every_fused_model_is_released_and_loads_again(gguf_pair, texts, tmp_path_factory):  # noqa: F811
    """--sleep-idle-seconds with adapters: the fused models for other scales go with the startup
    one (loaded again after waking, said on stderr), and the replies stay the same."""
    from conftest import wait_until

    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path_factory.mktemp("cfg")))
    args = ["-m", str(gguf_pair["base"]), "--lora", f"{gguf_pair['a']},{gguf_pair['b']}", "--sleep-idle-seconds", "1"]
    proc, url, lines = start_server(env, *args, "--no-warmup")
    log = list(lines)
    threading.Thread(target=lambda: log.extend(iter(proc.stderr.readline, "")), daemon=True).start()

    def fused_loads() -> int:
        return sum("weights fused at scales 1, 0 for a request" in ln for ln in log)

    try:
        assert _complete(url, _lora((1, 0)))[1]["content"] == texts[(1, 0)]
        assert fused_loads() == 1
        assert wait_until(lambda: get(url + "/props")["is_sleeping"], 20)
        assert _complete(url, _lora((1, 0)))[1]["content"] == texts[(1, 0)]
        assert fused_loads() == 2  # released asleep, so loaded again
        assert _complete(url)[1]["content"] == texts[(1, 1)]  # the startup scales: both at 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)
