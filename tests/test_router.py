"""serve --models-dir (llama-server's router mode), over real sockets: a folder of tiny models,
each loaded on first use in a process of its own, routed by the request's `model`, stopped for
another at --models-max (never while busy), loaded and unloaded by the API, a broken one failing
alone, keys checked at the router, and every process gone after SIGTERM. A routed reply equals
the model's own `mlxcel generate` output.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import make_tiny_model, mlxcel_cmd, wait_until

import mlxcel_py
from mlxcel_py.server.router.catalog import discover


def _start(models: Path | None, env: dict, *args: str):
    """A router on an ephemeral port (`models`: its --models-dir, or None for a preset alone)."""
    folder = ["--models-dir", str(models)] if models is not None else []
    proc = subprocess.Popen(
        mlxcel_cmd() + ["serve", *folder, "--port", "0", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: list[str] = []
    while True:
        line = proc.stderr.readline()
        if not line:
            proc.kill()
            raise RuntimeError("the router did not start: " + "".join(lines))
        lines.append(line)
        m = re.search(r"router listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            break
    threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True).start()
    return proc, f"http://127.0.0.1:{m.group(1)}", lines


def _call(method: str, url: str, body: dict | None = None, headers: dict | None = None, timeout: float = 120):
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def _status(url: str, model: str) -> dict:
    return next(m["status"] for m in _call("GET", url + "/models")[1]["data"] if m["id"] == model)


def _events(url: str) -> list[dict]:
    import urllib.request

    events: list[dict] = []

    def listen():
        with urllib.request.urlopen(url + "/models/sse", timeout=300) as r:
            for raw in r:
                if raw.startswith(b"data: "):
                    events.append(json.loads(raw[6:]))

    threading.Thread(target=listen, daemon=True).start()
    time.sleep(0.5)
    return events


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("models")
    for i, name in enumerate(("alpha", "beta", "gamma")):
        make_tiny_model(root / name, seed=i + 1, scale=2.5)
    make_tiny_model(root / "slow", seed=4, hidden=512, layers=8, scale=2.5)  # ~2.5 ms a token: seconds of decoding
    broken = root / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama"}')  # no weights: its server fails to load
    return root


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    # an empty Hugging Face cache: the router lists the cache's models too, and this machine's own
    # must not show up in the lists these tests compare
    cache = str(tmp_path_factory.mktemp("hub-cache"))
    return dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path_factory.mktemp("cfg")), LLAMA_CACHE=cache)


@pytest.fixture(scope="module")
def router(models, env):
    proc, url, lines = _start(models, env, "--models-max", "2", "--temp", "0", "-n", "8", "--tools", "get_info")
    yield url, lines, proc.pid
    proc.terminate()
    proc.wait(timeout=30)


def test_the_catalog_reads_files_folders_shards_and_projectors(tmp_path):
    (tmp_path / "small-Q4_K_M.gguf").write_bytes(b"GGUF")
    (tmp_path / "mmproj-small.gguf").write_bytes(b"GGUF")  # a projector is no model
    (tmp_path / ".hidden.gguf").write_bytes(b"GGUF")
    big = tmp_path / "big"
    big.mkdir()
    for k in (1, 2):
        (big / f"big-0000{k}-of-00002.gguf").write_bytes(b"GGUF")
    vision = tmp_path / "vision"
    vision.mkdir()
    (vision / "vision-Q8_0.gguf").write_bytes(b"GGUF")
    (vision / "mmproj-F16.gguf").write_bytes(b"GGUF")
    folder = tmp_path / "mlx-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    got = {e.id: (e.path.name, e.mmproj.name if e.mmproj else None) for e in discover(tmp_path)}
    assert got == {
        "small-Q4_K_M": ("small-Q4_K_M.gguf", None),
        "big": ("big-00001-of-00002.gguf", None),
        "mlx-model": ("mlx-model", None),
        "vision": ("vision-Q8_0.gguf", "mmproj-F16.gguf"),
    }


def test_a_model_gets_the_routers_flags_but_not_its_address_or_keys():
    from mlxcel_py.commands._router_argv import child_argv, serve_arguments
    from mlxcel_py.commands.serve import serve

    argv = ["--models-dir", "/m", "--port", "9", "--temp", "0", "-n", "8", "--api-key", "k", "--draft-max=4",
            "--no-models-autoload", "--host=0.0.0.0", "--prompt-lookup", "--models-max", "1", "-np", "2",
            "--tools", "all", "--tools-runtime", "ssh:h", "--mcp-servers-json", "{}"]  # fmt: skip
    assert child_argv(argv, serve) == ["--temp", "0", "-n", "8", "--draft-max=4", "--prompt-lookup", "-np", "2"]
    assert serve_arguments(["mlxcel", "serve", "--port", "1"]) == ["--port", "1"]
    assert serve_arguments(["mlxcel-server", "--port", "1"]) == ["--port", "1"]


def test_models_are_listed_loaded_on_first_use_and_reply_as_the_model_itself(router, models, env):
    url, lines, _ = router
    status, listed = _call("GET", url + "/v1/models")
    assert status == 200
    assert {m["id"]: m["status"]["value"] for m in listed["data"]} == {
        "alpha": "unloaded",
        "beta": "unloaded",
        "broken": "unloaded",
        "gamma": "unloaded",
        "slow": "unloaded",
    }
    assert _call("GET", url + "/props")[1] == {
        "role": "router",
        "max_instances": 2,
        "models_autoload": True,
        "build_info": f"b10621-mlxcel-py-{mlxcel_py.__version__}",  # llama-server's b<build>-... form
    }
    status, body = _call("POST", url + "/completion", {"model": "alpha", "prompt": "hello there", "n_predict": 8})
    assert status == 200, body
    alone = subprocess.run(
        mlxcel_cmd()
        + [
            "generate",
            "-m",
            str(models / "alpha"),
            "-p",
            "hello there",
            "--no-chat-template",
            "-n",
            "8",
            "--temp",
            "0",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert body["content"] == alone.stdout.rstrip("\n") and body["tokens_predicted"] == 8
    loaded = _status(url, "alpha")
    assert loaded["value"] == "loaded" and loaded["args"][:4] == ["mlxcel", "serve", "-m", str(models / "alpha")]
    assert "--temp" in loaded["args"] and "--models-dir" not in loaded["args"]
    # the OpenAI client, streaming, through the router
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="none")
    chunks = list(
        client.chat.completions.create(
            model="alpha", messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True
        )
    )
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    # GET routes name the model in the query
    assert _call("GET", url + "/props?model=alpha")[1]["model_alias"] == "alpha"
    status, err = _call("GET", url + "/slots")
    assert status == 400 and "?model=" in err["error"]["message"]
    assert _call("GET", url + "/", headers={"Accept": "application/json"}) == (
        200,
        {"status": "ok"},
    )  # browsers: the page
    assert _call("GET", url + "/health") == (200, {"status": "ok"})


@pytest.mark.parametrize(
    "body,fragment",
    [
        ({"model": "nope", "prompt": "x"}, "model 'nope' not found"),
        ({"prompt": "x"}, "the request names no model"),
        ({"model": 7, "prompt": "x"}, "the request names no model"),
    ],
)
def test_requests_for_no_known_model_are_400s(router, body, fragment):
    status, err = _call("POST", router[0] + "/v1/completions", body)
    assert status == 400 and fragment in err["error"]["message"]


def test_a_model_that_fails_to_load_fails_alone(router):
    url, _, _ = router
    status, err = _call("POST", url + "/v1/completions", {"model": "broken", "prompt": "x"})
    assert status == 503 and "model broken failed to load (exit code 1)" in err["error"]["message"]
    failed = _status(url, "broken")
    assert failed["value"] == "unloaded" and failed["failed"] is True and failed["exit_code"] == 1
    assert _call("POST", url + "/v1/completions", {"model": "alpha", "prompt": "x", "max_tokens": 2})[0] == 200


def test_load_unload_and_the_lru_model_makes_room(router):
    url, _, _ = router
    assert _call("POST", url + "/models/load", {"model": "beta"}) == (200, {"success": True})
    assert wait_until(lambda: _status(url, "beta")["value"] == "loaded")
    status, err = _call("POST", url + "/models/load", {"model": "beta"})
    assert status == 400 and "already running" in err["error"]["message"]
    # alpha (used before beta) and beta are loaded: gamma takes the least recently used one's place
    _call("POST", url + "/v1/completions", {"model": "alpha", "prompt": "x", "max_tokens": 2})
    assert _call("POST", url + "/v1/completions", {"model": "gamma", "prompt": "x", "max_tokens": 2})[0] == 200
    assert {m: _status(url, m)["value"] for m in ("alpha", "beta", "gamma")} == {
        "alpha": "loaded",
        "beta": "unloaded",
        "gamma": "loaded",
    }
    assert _call("POST", url + "/models/unload", {"model": "gamma"}) == (200, {"success": True})
    assert _status(url, "gamma")["value"] == "unloaded" and "failed" not in _status(url, "gamma")
    status, err = _call("POST", url + "/models/unload", {"model": "gamma"})
    assert status == 400 and "not running" in err["error"]["message"]


def test_a_busy_model_is_not_stopped_for_another_and_no_autoload_waits_for_a_load(models, env):
    proc, url, lines = _start(models, env, "--models-max", "1", "--no-models-autoload", "--temp", "0")
    try:
        status, err = _call("POST", url + "/v1/completions", {"model": "slow", "prompt": "x"})
        assert status == 400 and "not loaded" in err["error"]["message"]
        assert _call("POST", url + "/models/load", {"model": "slow"})[0] == 200
        assert wait_until(lambda: _status(url, "slow")["value"] == "loaded")
        results: dict = {}

        def long():
            body = {"model": "slow", "prompt": "x", "n_predict": 1800, "ignore_eos": True}
            results["slow"] = _call("POST", url + "/completion", body, timeout=300)

        def other():  # asks for the only place while slow decodes (autoload asked for per request)
            body = {"model": "beta", "prompt": "x", "n_predict": 2}
            results["beta"] = _call("POST", url + "/completion?autoload=true", body)

        busy, waiting = threading.Thread(target=long), threading.Thread(target=other)
        busy.start()
        time.sleep(0.5)
        waiting.start()
        time.sleep(1.0)
        assert busy.is_alive() and waiting.is_alive()  # beta waits for slow's place
        assert _status(url, "slow")["value"] == "loaded" and _status(url, "beta")["value"] == "unloaded"
        busy.join(timeout=300)
        waiting.join(timeout=300)
        assert results["slow"][0] == 200 and results["slow"][1]["tokens_predicted"] == 1800  # never cut short
        assert results["beta"][0] == 200
        assert _status(url, "slow")["value"] == "unloaded" and _status(url, "beta")["value"] == "loaded"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_keys_are_checked_at_the_router(models, env):
    proc, url, _ = _start(models, env, "--api-key", "sk-router")
    try:
        body = {"model": "alpha", "prompt": "x", "max_tokens": 2}
        status, err = _call("POST", url + "/v1/completions", body)
        assert status == 401 and err["error"]["type"] == "authentication_error"
        assert _call("GET", url + "/models")[0] == 200  # public, as on one model's server
        assert _call("POST", url + "/v1/completions", body, headers={"Authorization": "Bearer sk-router"})[0] == 200
        args = _status(url, "alpha")["args"]
        assert "sk-router" not in " ".join(args)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_sigterm_stops_the_router_and_every_model_within_seconds(models, env):
    proc, url, _ = _start(models, env)
    for m in ("alpha", "beta"):
        assert _call("POST", url + "/v1/completions", {"model": m, "prompt": "x", "max_tokens": 2})[0] == 200
    pids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert len(pids) == 2
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert time.monotonic() - start < 15
    for pid in pids:
        assert wait_until(lambda pid=pid: not Path(f"/proc/{pid}").exists(), 10), (
            f"model process {pid} outlived the router"
        )


def test_a_model_process_that_dies_is_marked_failed_and_started_again_on_the_next_request(router):
    url, _, router_pid = router
    assert _call("POST", url + "/v1/completions", {"model": "alpha", "prompt": "x", "max_tokens": 2})[0] == 200
    pid = next(
        int(p)
        for p in subprocess.run(
            ["pgrep", "-P", str(router_pid), "-f", "--", "--alias alpha"], capture_output=True, text=True
        ).stdout.split()
    )
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: _status(url, "alpha").get("failed") is True, 20)
    assert _status(url, "alpha")["exit_code"] == -9
    assert _call("POST", url + "/v1/completions", {"model": "alpha", "prompt": "x", "max_tokens": 2})[0] == 200
    assert _status(url, "alpha")["value"] == "loaded"


def _refused(ini: Path, *cases: tuple[str, str]) -> None:
    """Each preset text is exit 2 (a UsageError) with its message."""
    from mlxcel_py.commands._router_argv import read_preset
    from mlxcel_py.commands.serve import serve
    from mlxcel_py.errors import UsageError

    for body, message in cases:
        ini.write_text(body)
        with pytest.raises(UsageError, match=re.escape(message)):
            read_preset(str(ini), serve)


def test_a_preset_file_reads_into_flags_per_model(tmp_path):
    from mlxcel_py.commands._router_argv import read_preset
    from mlxcel_py.commands.serve import serve

    ini = tmp_path / "models.ini"
    ini.write_text(
        "version = 1\n[*]\nc = 4096\ntemp = 0.5\nwarmup = false\n\n"
        "[alpha]\nmodel = /m/alpha\nn-predict = 3\ntemp = 0\nprompt-lookup = true\nload-on-startup = true\n"
        "stop-timeout = 4\n"
    )
    preset = read_preset(str(ini), serve)
    assert preset.flags["*"] == ["-c", "4096", "--temp", "0.5", "--no-warmup"]
    assert preset.flags_for("alpha") == ["-c", "4096", "--temp", "0.5", "--no-warmup", "--n-predict", "3", "--temp", "0", "--prompt-lookup"]  # fmt: skip
    assert (
        preset.paths == {"alpha": "/m/alpha"} and preset.startup == {"alpha"} and preset.stop_timeout == {"alpha": 4.0}
    )
    _refused(
        ini,
        ("[*]\nno-such-flag = 1\n", "[*] no-such-flag: not a serve flag"),
        ("[*]\nport = 9\n", "[*] port: the router sets it for every model"),
        ("[*]\nprompt-lookup = maybe\n", "prompt-lookup is a switch: true or false"),
        ("[a]\nstop-timeout = soon\n", "stop-timeout must be a number of seconds"),
        ("[*\n", "not an INI file"),
    )


def test_a_router_from_a_preset_alone_with_its_precedence_and_startup_load(models, env, tmp_path):
    ini = tmp_path / "models.ini"
    ini.write_text(
        f"version = 1\n[*]\ntemp = 0.5\nn-predict = 5\n\n[alpha]\nmodel = {models / 'alpha'}\ntemp = 0\n"
        f"n-predict = 3\nload-on-startup = true\n\n[beta]\nmodel = {models / 'beta'}\n"
    )
    proc, url, _ = _start(None, env, "--models-preset", str(ini), "-n", "4")
    try:
        assert sorted(m["id"] for m in _call("GET", url + "/models")[1]["data"]) == ["alpha", "beta"]
        assert wait_until(lambda: _status(url, "alpha")["value"] == "loaded", 60)  # loaded at startup, unasked
        assert _status(url, "beta")["value"] == "unloaded"
        settings = {
            m: _call("GET", url + f"/props?model={m}")[1]["default_generation_settings"]["params"]
            for m in ("alpha", "beta")
        }
        # the command line's -n wins over both sections; [alpha]'s temp over [*]'s
        assert settings["alpha"]["n_predict"] == 4 and settings["beta"]["n_predict"] == 4
        assert settings["alpha"]["temperature"] == 0.0 and settings["beta"]["temperature"] == 0.5
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_reload_events_and_a_sleeping_model(models, env, tmp_path):
    ini = tmp_path / "models.ini"
    ini.write_text(f"[a]\nmodel = {models / 'alpha'}\n\n[b]\nmodel = {models / 'beta'}\n")
    proc, url, _ = _start(None, env, "--models-preset", str(ini), "--sleep-idle-seconds", "1")
    try:
        events = _events(url)
        assert _call("POST", url + "/v1/completions", {"model": "a", "prompt": "x", "max_tokens": 2})[0] == 200
        # --sleep-idle-seconds reaches the model's server: asleep, the router lists it so
        assert wait_until(lambda: _status(url, "a")["value"] == "sleeping", 30)
        # the preset edited: b gone, c new; a (running, same path) stays
        ini.write_text(f"[a]\nmodel = {models / 'alpha'}\n\n[c]\nmodel = {models / 'gamma'}\n")
        ids = [m["id"] for m in _call("GET", url + "/models?reload=1")[1]["data"]]
        assert sorted(ids) == ["a", "c"] and _status(url, "a")["value"] in ("loaded", "sleeping")
        ini.write_text("[a]\nno-such-flag = 1\n")
        status, err = _call("GET", url + "/models?reload=1")
        assert status == 400 and "no-such-flag" in err["error"]["message"]
        assert sorted(m["id"] for m in _call("GET", url + "/models")[1]["data"]) == ["a", "c"]  # unchanged
        assert wait_until(lambda: {"model_remove", "models_reload"} <= {e["event"] for e in events}, 10)
        statuses = [e["data"]["status"] for e in events if e["model"] == "a" and e["event"] == "model_status"]
        assert statuses[:2] == ["loading", "loaded"]
        assert {"model": "b", "event": "model_remove"} in events
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_model_that_does_not_listen_in_time_is_stopped_and_its_request_told(models, env):
    proc, url, _ = _start(models, dict(env, MLXCEL_ROUTER_LOAD_TIMEOUT="0.2"))
    try:
        status, err = _call("POST", url + "/v1/completions", {"model": "alpha", "prompt": "x", "max_tokens": 2})
        assert status == 503 and "not listening after 0.2 s (MLXCEL_ROUTER_LOAD_TIMEOUT)" in err["error"]["message"]
        assert _status(url, "alpha")["failed"] is True
        assert subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True).stdout == b""
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize(
    "raw,status,fragment",
    [
        (b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply"),
        (b'{"model": "alpha", "prompt": NaN}', 400, "not a number JSON allows"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (b'{"model": "alpha", "prompt": "\\ud800"}', 400, "lone UTF-16 surrogate"),
        (b"{not json", 400, "malformed JSON body"),
    ],
)
def test_hostile_bodies_are_the_routers_4xx_and_it_keeps_serving(router, raw, status, fragment):
    import urllib.error
    import urllib.request

    url = router[0]
    req = urllib.request.Request(url + "/v1/completions", data=raw, headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == status and fragment in e.value.read().decode()
    assert _call("GET", url + "/health") == (200, {"status": "ok"})


def test_a_body_over_the_limit_is_refused_from_its_length(router):
    import socket

    url = router[0]  # refused from its Content-Length, before the body is read
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        sock.sendall((head + f"Content-Length: {9 * 2**20}\r\n\r\n").encode())
        assert b" 413 " in sock.recv(4096).split(b"\r\n")[0] + b" "


def test_the_router_serves_tools_and_the_pages_files_itself(router):
    """--tools belongs to the router (where the page is), not to its models' servers."""
    import urllib.request

    url, lines, _ = router
    assert any("tools (experimental): get_info at /tools" in ln for ln in lines)
    status, listed = _call("GET", url + "/tools")
    assert status == 200 and [t["tool"] for t in listed] == ["get_info"]
    status, info = _call("POST", url + "/tools", {"tool": "get_info", "params": {}})
    assert status == 200 and info["os"] and info["cwd"]
    with urllib.request.urlopen(url + "/sw.js", timeout=30) as r:
        assert b"registration.unregister()" in r.read()
    with urllib.request.urlopen(url + "/_app/version.json", timeout=30) as r:
        assert json.loads(r.read())["version"]


# -- the Hugging Face cache: listed, named by presets, downloaded into, removed from ----------------

COMMIT = "ab" * 20


def _cache_repo(root: Path, repo: str, files: dict[str, bytes | Path], ref: str = "main") -> Path:
    """One repo in the hub's cache layout: blobs, a snapshot of links to them, refs/REF."""
    import hashlib

    folder = root / ("models--" + repo.replace("/", "--"))
    snap = folder / "snapshots" / COMMIT
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / ref).write_text(COMMIT)
    for name, content in files.items():
        data = content.read_bytes() if isinstance(content, Path) else content
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).symlink_to(os.path.relpath(blob, (snap / name).parent))
    return snap


def test_the_cache_lists_tags_shards_projectors_and_mlx_folders_as_llama_cpp_does(tmp_path, monkeypatch):
    from mlxcel_py.models import hub_cache

    g = b"GGUF"
    _cache_repo(
        tmp_path,
        "org/Small-GGUF",
        {
            "small-Q4_K_M.gguf": g,
            "small-Q8_0.gguf": g + b"8",
            "mmproj-small-F16.gguf": g + b"p",
            "imatrix.gguf": g + b"i",
        },
    )
    _cache_repo(tmp_path, "org/Big-GGUF", {f"Q4_0/big-Q4_0-0000{k}-of-00002.gguf": g + bytes([k]) for k in (1, 2)})
    _cache_repo(tmp_path, "org/NoTag", {"model.gguf": g})  # no tag in the name: llama.cpp lists none
    _cache_repo(tmp_path, "org/Drafter-GGUF", {"eagle3-x-Q8_0.gguf": g})  # a drafter's file is no model
    mlx = _cache_repo(
        tmp_path, "mlx-community/tiny-4bit", {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"w"}
    )
    _cache_repo(tmp_path, "org/bert", {"config.json": b'{"model_type": "no_such_family"}', "model.safetensors": b"w"})
    _cache_repo(tmp_path, "org/Other-GGUF", {"o-Q8_0.gguf": g}, ref="v1")  # no main: the other ref is read
    (tmp_path / "models--org--Bad" / "refs").mkdir(parents=True)  # no valid commit anywhere
    (tmp_path / "models--org--Bad" / "refs" / "main").write_text("not a commit")
    got = {m.id: (m.path.name, m.mmproj.name if m.mmproj else None) for m in hub_cache.models(tmp_path)}
    assert got == {
        "org/Big-GGUF:Q4_0": ("big-Q4_0-00001-of-00002.gguf", None),
        "org/Other-GGUF:Q8_0": ("o-Q8_0.gguf", None),
        "org/Small-GGUF:Q4_K_M": ("small-Q4_K_M.gguf", "mmproj-small-F16.gguf"),
        "org/Small-GGUF:Q8_0": ("small-Q8_0.gguf", "mmproj-small-F16.gguf"),
        "mlx-community/tiny-4bit": ("tiny-4bit" if False else mlx.name, None),
    }
    # OWNER/NAME[:QUANT] as llama.cpp resolves it: the tag's file; no tag: Q4_K_M, then Q8_0, then the first
    assert hub_cache.resolve(tmp_path, "org/Small-GGUF:q8_0").name == "small-Q8_0.gguf"
    assert hub_cache.resolve(tmp_path, "org/Small-GGUF").name == "small-Q4_K_M.gguf"
    assert hub_cache.resolve(tmp_path, "org/NoTag").name == "model.gguf"
    assert hub_cache.resolve(tmp_path, "org/Small-GGUF:Q2_K") is None
    assert hub_cache.resolve(tmp_path, "org/Small-GGUF", "small-Q8_0.gguf").name == "small-Q8_0.gguf"
    assert hub_cache.resolve(tmp_path, "mlx-community/tiny-4bit") == mlx
    for bad in ("no-slash", "a/b/c", "a/-b", "a/b:Q4 K", "../x/y", "a/b:"[:0] or "/b"):
        with pytest.raises(ValueError, match="not a Hugging Face repo"):
            hub_cache.split_spec(bad)
    # removing a tag deletes its links and the blobs no other link uses; the repo's other tag stays
    small = tmp_path / "models--org--Small-GGUF"
    assert hub_cache.remove(tmp_path, "org/Small-GGUF:Q8_0")
    assert sorted(m.id for m in hub_cache.models(tmp_path) if m.id.startswith("org/Small")) == ["org/Small-GGUF:Q4_K_M"]
    assert len(list((small / "blobs").iterdir())) == 3  # Q4_K_M, the projector, imatrix
    assert not hub_cache.remove(tmp_path, "org/Small-GGUF:Q8_0")  # nothing left of it
    assert hub_cache.remove(tmp_path, "org/Big-GGUF") and not (tmp_path / "models--org--Big-GGUF").exists()
    # a cache named by a relative path (LLAMA_CACHE=tmp, as llama.cpp's suite sets it): blobs go too
    _cache_repo(tmp_path, "org/Rel-GGUF", {"r-Q8_0.gguf": g + b"r", "r-Q4_0.gguf": g + b"s"})
    monkeypatch.chdir(tmp_path.parent)
    assert hub_cache.remove(Path(tmp_path.name), "org/Rel-GGUF:Q8_0")
    assert len(list((tmp_path / "models--org--Rel-GGUF" / "blobs").iterdir())) == 1


def test_a_preset_names_cache_models_and_their_drafters_by_repo(tmp_path):
    from mlxcel_py.commands._router_argv import read_preset
    from mlxcel_py.commands.serve import serve

    ini = tmp_path / "models.ini"
    ini.write_text("[*]\ndedup-cache-models = false\n[m]\nhf-repo = org/M-GGUF:Q8_0\nspec-draft-hf = org/D-GGUF\n"
                   "dedup-cache-models = 1\n[f]\nhf = org/F\nhf-file = sub/f-Q4_0.gguf\n")  # fmt: skip
    preset = read_preset(str(ini), serve)
    assert preset.hf == {"m": "org/M-GGUF:Q8_0", "f": "org/F"} and preset.hf_file == {"f": "sub/f-Q4_0.gguf"}
    assert preset.draft_hf == {"m": "org/D-GGUF"} and preset.dedup == {"m"} and preset.flags["m"] == []
    _refused(
        ini,
        ("[*]\nhf-repo = org/x\n", "[*] hf-repo: a repo names one model"),
        ("[m]\nhf-repo = not-a-repo\n", "[m] hf-repo: 'not-a-repo' is not a Hugging Face repo"),
        ("[m]\nmodel = /m\nhf-repo = org/x\n", "[m] gives both model and hf-repo"),
        ("[m]\nhf-file = x.gguf\n", "[m] hf-file names a file of hf-repo"),
        ("[m]\ndedup-cache-models = perhaps\n", "dedup-cache-models is a switch"),
    )


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    import gguf_files
    from gguf import GGMLQuantizationType as Q

    path = tmp_path_factory.mktemp("gguf") / "tiny-Q8_0.gguf"
    gguf_files.write(path, "llama", [Q.Q8_0])
    return path


def test_cache_models_are_served_hidden_by_a_dedup_preset_and_removed(tiny_gguf, models, env, tmp_path):
    cache = tmp_path / "cache"
    _cache_repo(cache, "org/Tiny-GGUF", {"tiny-Q8_0.gguf": tiny_gguf})
    _cache_repo(cache, "org/Draft-GGUF", {"draft-Q8_0.gguf": tiny_gguf})
    ini = tmp_path / "models.ini"
    ini.write_text("[mine]\nhf-repo = org/Tiny-GGUF:Q8_0\nspec-draft-hf = org/Draft-GGUF\ntemp = 0\n")
    proc, url, lines = _start(models, dict(env, LLAMA_CACHE=str(cache)), "--models-preset", str(ini), "-n", "4")
    try:
        listed = {m["id"]: m for m in _call("GET", url + "/models")[1]["data"]}
        assert {"org/Tiny-GGUF:Q8_0", "org/Draft-GGUF:Q8_0", "mine", "alpha"} <= set(listed)
        assert listed["org/Tiny-GGUF:Q8_0"]["source"] == "cache" and listed["org/Tiny-GGUF:Q8_0"]["can_remove"]
        assert listed["alpha"]["source"] == "models_dir" and listed["mine"]["source"] == "preset"
        # the preset's model is the cached file, drafted by the cached drafter
        status, body = _call("POST", url + "/completion", {"model": "mine", "prompt": "ab", "n_predict": 3})
        assert status == 200 and body["tokens_predicted"] == 3, body
        args = _status(url, "mine")["args"]
        assert args[args.index("-m") + 1].endswith("tiny-Q8_0.gguf")
        assert args[args.index("--draft-model") + 1].endswith("draft-Q8_0.gguf")
        # dedup-cache-models: the entries the preset stands for leave the list, and still answer
        ini.write_text(ini.read_text() + "dedup-cache-models = true\n")
        ids = {m["id"] for m in _call("GET", url + "/models?reload=1")[1]["data"]}
        assert "mine" in ids and not {"org/Tiny-GGUF:Q8_0", "org/Draft-GGUF:Q8_0"} & ids
        assert _call("POST", url + "/tokenize", {"model": "org/Tiny-GGUF:Q8_0", "content": "ab"})[0] == 200
        # DELETE /models: a cache model is stopped and its files deleted; others are not removable
        events = _events(url)
        assert _call("DELETE", url + "/models?model=org/Tiny-GGUF:Q8_0") == (200, {"success": True})
        assert any("router: org/Tiny-GGUF:Q8_0 unloaded" in ln for ln in lines)  # it was running: stopped first
        assert not (cache / "models--org--Tiny-GGUF" / "blobs").exists() or not any(
            (cache / "models--org--Tiny-GGUF" / "blobs").iterdir()
        )
        assert "org/Tiny-GGUF:Q8_0" not in {m["id"] for m in _call("GET", url + "/models")[1]["data"]}
        assert wait_until(lambda: {"model": "org/Tiny-GGUF:Q8_0", "event": "model_remove"} in events, 10)
        status, err = _call("DELETE", url + "/models?model=alpha")
        assert status == 400 and "not removable" in err["error"]["message"]
        status, err = _call("DELETE", url + "/models?model=org/Nothing:Q8_0")
        assert status == 400 and "not found" in err["error"]["message"]
        # the preset's file is gone: its section is left out with one line saying how to get it back
        ids = {m["id"] for m in _call("GET", url + "/models?reload=1")[1]["data"]}
        assert "mine" not in ids
        assert wait_until(lambda: any("[mine] hf-repo org/Tiny-GGUF:Q8_0: not in the Hugging Face cache" in ln
                                      for ln in lines), 5)  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_post_models_downloads_from_the_hub_and_delete_cancels_a_download(tiny_gguf, models, env, tmp_path):
    from fake_hub import FakeHub

    big = tmp_path / "big-Q4_0.gguf"
    big.write_bytes(tiny_gguf.read_bytes() * 8)  # slow to send (below): caught in flight
    hub = FakeHub({"org/Tiny-GGUF": {"tiny-Q8_0.gguf": tiny_gguf, "README.md": tmp_path / "big-Q4_0.gguf"},
                   "org/Big-GGUF": {"big-Q4_0.gguf": big}}, delay=0.0)  # fmt: skip
    cache = tmp_path / "cache"
    cache.mkdir()
    # --offline, as llama.cpp's suite starts its router: a download asked for still goes ahead
    run_env = dict(env, LLAMA_CACHE=str(cache), HF_ENDPOINT=hub.url)
    proc, url, lines = _start(models, run_env, "--offline", "-n", "3", "--temp", "0")
    try:
        events = _events(url)
        assert _call("POST", url + "/models", {"model": "org/Tiny-GGUF:Q8_0"}) == (200, {"success": True})
        assert wait_until(lambda: any(e["event"] == "download_finished" for e in events), 60)
        assert any(e["event"] == "download_progress" and e["model"] == "org/Tiny-GGUF:Q8_0" for e in events)
        assert "README.md" not in str(hub.requests)  # only the model's file is fetched
        listed = {m["id"]: m for m in _call("GET", url + "/models")[1]["data"]}
        assert listed["org/Tiny-GGUF:Q8_0"]["source"] == "cache"
        snap = Path(listed["org/Tiny-GGUF:Q8_0"]["path"])
        assert snap.is_relative_to(cache) and snap.read_bytes() == tiny_gguf.read_bytes()
        status, body = _call("POST", url + "/completion", {"model": "org/Tiny-GGUF:Q8_0", "prompt": "ab"})
        assert status == 200 and body["tokens_predicted"] == 3  # the downloaded model serves
        status, err = _call("POST", url + "/models", {"model": "org/Tiny-GGUF:Q8_0"})
        assert status == 400 and "already exists" in err["error"]["message"]
        for spec, fragment in (("org/Missing", "cannot download org/Missing"), ("org/Tiny-GGUF:Q2_K", "has no Q2_K GGUF"),
                               ("org", "not a Hugging Face repo"), (7, "non-empty string")):  # fmt: skip
            status, err = _call("POST", url + "/models", {"model": spec})
            assert status == 400 and fragment in err["error"]["message"], (spec, err)
        # two POSTs of one model while the hub is asked: one download, the other refused
        hub.tree_delay = 1.0
        both: list = []
        posts = [
            threading.Thread(target=lambda: both.append(_call("POST", url + "/models", {"model": "org/Big-GGUF:Q4_0"})))
            for _ in range(2)
        ]
        for t in posts:
            t.start()
        for t in posts:
            t.join(60)
        assert sorted(status for status, _ in both) == [200, 400]
        assert "already exists" in next(body for status, body in both if status == 400)["error"]["message"]
        assert wait_until(lambda: any(e["event"] == "download_finished" and e["model"] == "org/Big-GGUF:Q4_0"
                                      for e in events), 60)  # fmt: skip
        assert _call("DELETE", url + "/models?model=org/Big-GGUF:Q4_0") == (200, {"success": True})
        hub.tree_delay = 0.0
        events.clear()
        # a download in flight is listed as downloading; DELETE cancels it and leaves nothing behind
        hub.delay = 0.2
        assert _call("POST", url + "/models", {"model": "org/Big-GGUF:Q4_0"})[0] == 200
        assert wait_until(lambda: _status(url, "org/Big-GGUF:Q4_0")["value"] == "downloading", 10)
        assert _call("DELETE", url + "/models?model=org/Big-GGUF:Q4_0") == (200, {"success": True})
        assert wait_until(lambda: {"model": "org/Big-GGUF:Q4_0", "event": "model_remove"} in events, 10)
        time.sleep(1)
        assert not any(e["event"].startswith("download_f") and e["model"] == "org/Big-GGUF:Q4_0" for e in events)
        assert "org/Big-GGUF:Q4_0" not in {m["id"] for m in _call("GET", url + "/models")[1]["data"]}
        gone = cache / "models--org--Big-GGUF"
        assert not gone.exists() or not any(p.is_file() and p.stat().st_size > 0 for p in gone.rglob("*"))
        out = subprocess.run(["pgrep", "-f", "mlxcel_py.server.router.downloads"], capture_output=True, text=True)
        assert out.stdout.strip() == ""  # the download's process is gone
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        hub.close()


def test_a_client_that_leaves_while_queued_costs_no_model_its_place(models, env):
    """llama-server's LLAMA_SERVER_DEBUG_FAKE_TIMING (2 s before a load and in each proxied
    request, which its suite's queue tests use) holds alpha busy while beta's client gives up."""
    import urllib.error

    proc, url, _ = _start(models, dict(env, LLAMA_SERVER_DEBUG_FAKE_TIMING="1"), "--models-max", "1")
    try:
        assert _call("POST", url + "/models/load", {"model": "alpha"})[0] == 200
        assert wait_until(lambda: _status(url, "alpha")["value"] == "loaded", 60)
        busy: dict = {}
        worker = threading.Thread(
            target=lambda: busy.update(r=_call("POST", url + "/tokenize", {"model": "alpha", "content": "ab"}))
        )
        start = time.monotonic()
        worker.start()
        time.sleep(0.5)
        with pytest.raises((TimeoutError, urllib.error.URLError)):
            _call("POST", url + "/tokenize", {"model": "beta", "content": "ab"}, timeout=1)
        worker.join(30)
        assert busy["r"][0] == 200 and time.monotonic() - start >= 2.0  # the knob's 2 s in flight
        time.sleep(3)
        assert _status(url, "alpha")["value"] == "loaded" and _status(url, "beta")["value"] == "unloaded"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_resumable_streams_through_the_router_and_a_stop_during_the_models_load(models, env):
    """X-Conversation-Id through the router: the session's model is remembered from the POST, so
    GET/DELETE /v1/stream reach it (503 while it loads); a Stop while the model loads cancels the
    waiting request; a client that leaves during the load still gets its session filled."""
    import http.client

    proc, url, _ = _start(models, env, "--temp", "0")
    host, port = url.removeprefix("http://").split(":")

    def post(conv: str, n: int) -> http.client.HTTPConnection:
        c = http.client.HTTPConnection(host, int(port), timeout=120)
        body = {"model": "slow", "prompt": "abc", "n_predict": n, "ignore_eos": True, "stream": True}
        c.request(
            "POST", "/completion", json.dumps(body), {"Content-Type": "application/json", "X-Conversation-Id": conv}
        )
        return c

    def stream(conv: str, method: str = "GET") -> tuple[int, bytes]:
        c = http.client.HTTPConnection(host, int(port), timeout=120)
        c.request(method, f"/v1/stream?conv_id={conv}" + ("&from=0" if method == "GET" else ""))
        r = c.getresponse()
        return r.status, r.read()

    try:
        # the client leaves while "slow" loads; the session is filled all the same
        c = post("ggml/x::slow", 600)
        assert wait_until(lambda: _status(url, "slow")["value"] == "loading", 10)
        assert stream("ggml/x::slow")[0] == 503  # retry later: its model loads
        c.sock.close()
        c.close()
        assert wait_until(lambda: stream("ggml/x::slow")[0] == 200, 120)
        status, raw = stream("ggml/x::slow")
        assert status == 200 and json.loads(raw.decode().strip().splitlines()[-1][6:])["tokens_predicted"] == 600
        found = _call("POST", url + "/v1/streams/lookup", {"conversation_ids": ["ggml/x"]})[1]
        assert [d["conversation_id"] for d in found] == ["ggml/x::slow"]
        assert stream("ggml/x::slow", "DELETE")[0] == 204
        assert stream("ggml/x::slow")[0] == 404
        # a Stop while the model loads: the waiting request is answered 400, nothing is generated
        assert _call("POST", url + "/models/unload", {"model": "slow"})[0] == 200
        assert wait_until(lambda: _status(url, "slow")["value"] == "unloaded", 30)
        c = post("conv-stop", 600)
        assert wait_until(lambda: _status(url, "slow")["value"] == "loading", 10)
        assert stream("conv-stop", "DELETE")[0] == 204
        r = c.getresponse()
        assert r.status == 400 and b"cancelled by a stop" in r.read()
        assert stream("conv-stop")[0] == 404
    finally:
        proc.terminate()
        proc.wait(timeout=30)
