"""llama.cpp's `-hf OWNER/NAME[:QUANT]` (models/hub.py): the model from the Hugging Face cache, or
downloaded into it from a hub (tests/fake_hub.py on loopback), loaded as `-m FILE` would load it;
bad specs refused before anything loads; a preset repo served as a router (llama-server's remote
presets).
"""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import mlxcel_cmd
from fake_hub import FakeHub
from test_router import _cache_repo, _call
from test_server import start_server


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    import gguf_files
    from gguf import GGMLQuantizationType as Q

    path = tmp_path_factory.mktemp("gguf") / "tiny-Q8_0.gguf"
    gguf_files.write(path, "llama", [Q.Q8_0])
    return path


def _env(tmp_path, **extra) -> dict:
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "cfg"), LLAMA_CACHE=str(tmp_path / "cache"), **extra)
    env.pop("HF_HUB_OFFLINE", None)
    return env


def _generate(env: dict, *model: str) -> subprocess.CompletedProcess:
    cmd = mlxcel_cmd() + ["generate", *model, "-p", "ab", "-n", "6", "--temp", "0", "--no-chat-template"]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize(
    "args, message",
    [
        (["-hf", "not-a-repo"], "--hf-repo: 'not-a-repo' is not a Hugging Face repo: OWNER/NAME[:QUANT]"),
        (["-hf", "a/b:Q4 K"], "is not a Hugging Face repo"),
        (["-m", "x.gguf", "-hf", "a/b"], "-m x.gguf and --hf-repo a/b both name the model; give one"),
        (["-hff", "f.gguf"], "--hf-file f.gguf: names a file of --hf-repo's repo; give --hf-repo too"),
        (["-hf", "a/b", "--revision", "v1"], "--revision applies to -m OWNER/NAME"),
        (["-hfd", "nope"], "--spec-draft-hf: 'nope' is not a Hugging Face repo: OWNER/NAME[:QUANT]"),
    ],
)
def test_bad_hub_specs_are_usage_errors_before_anything_loads(tmp_path, args, message):
    r = _generate(_env(tmp_path, HF_ENDPOINT="http://127.0.0.1:9"), *args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_hf_loads_the_cached_or_downloaded_quant_as_its_file_would(tmp_path, tiny_gguf):
    plain = _generate(_env(tmp_path), "-m", str(tiny_gguf))
    assert plain.returncode == 0 and plain.stdout
    hub = FakeHub({"org/Tiny-GGUF": {"tiny-Q4_0.gguf": tiny_gguf, "tiny-Q8_0.gguf": tiny_gguf,
                                     "README.md": tiny_gguf}})  # fmt: skip
    try:
        env = _env(tmp_path, HF_ENDPOINT=hub.url)
        got = _generate(env, "-hf", "org/Tiny-GGUF:q8_0")  # downloaded, then loaded
        assert got.returncode == 0, got.stderr
        assert got.stdout == plain.stdout
        fetched = [r for r in hub.requests if "/resolve/" in r]
        assert fetched and all("tiny-Q8_0.gguf" in r for r in fetched)  # that quant's file only
        assert (tmp_path / "cache" / "models--org--Tiny-GGUF").is_dir()
        missing = _generate(env, "-hf", "org/Tiny-GGUF:Q2_K")
        assert missing.returncode == 1 and "org/Tiny-GGUF:Q2_K: org/Tiny-GGUF has no Q2_K GGUF" in missing.stderr
        nothing = _generate(env, "-hf", "org/Nothing")
        assert nothing.returncode == 1 and "cannot list org/Nothing on the Hugging Face hub" in nothing.stderr
    finally:
        hub.close()
    # the hub gone and offline: the cache's copy still loads, anything else says why
    offline = _env(tmp_path, HF_ENDPOINT="http://127.0.0.1:9")
    again = _generate(offline, "-hf", "org/Tiny-GGUF:Q8_0", "--offline")
    assert again.returncode == 0 and again.stdout == plain.stdout
    gone = _generate(offline, "-hf", "org/Tiny-GGUF:Q4_0", "--offline")
    assert gone.returncode == 1 and "not in the Hugging Face cache" in gone.stderr and "--offline" in gone.stderr


def test_hfd_fetches_the_drafter_and_md_names_its_file(tmp_path, tiny_gguf):
    """llama-server's -hfd: the drafter's repo, resolved as -hf resolves a model; -md beside it is a
    file of that repo. The output is the target's own (equal to plain decoding)."""
    plain = _generate(_env(tmp_path), "-m", str(tiny_gguf))
    hub = FakeHub({"org/Draft-GGUF": {"tiny-Q4_0.gguf": tiny_gguf, "tiny-Q8_0.gguf": tiny_gguf}})
    try:
        env = _env(tmp_path, HF_ENDPOINT=hub.url)
        got = _generate(env, "-m", str(tiny_gguf), "-hfd", "org/Draft-GGUF:Q8_0", "--verbose")
        assert got.returncode == 0, got.stderr
        assert got.stdout == plain.stdout
        assert "speculative=full-model (draft_model=" in got.stderr and "models--org--Draft-GGUF" in got.stderr
        assert [r for r in hub.requests if "/resolve/" in r and "tiny-Q8_0.gguf" in r]
        named = _generate(env, "-m", str(tiny_gguf), "--hf-repo-draft", "org/Draft-GGUF", "-md", "tiny-Q4_0.gguf")
        assert named.returncode == 0 and named.stdout == plain.stdout, named.stderr
        assert [r for r in hub.requests if "/resolve/" in r and "tiny-Q4_0.gguf" in r]
        wrong = _generate(env, "-m", str(tiny_gguf), "-hfd", "org/Draft-GGUF", "-md", "other.gguf")
        assert wrong.returncode == 1 and "-md other.gguf: no such file in org/Draft-GGUF" in wrong.stderr
    finally:
        hub.close()


def test_serve_names_an_hf_model_by_its_repo_and_a_preset_repo_is_a_router(tmp_path, tiny_gguf):
    cache = tmp_path / "cache"
    _cache_repo(cache, "org/Tiny-GGUF", {"tiny-Q8_0.gguf": tiny_gguf})
    env = _env(tmp_path, HF_HUB_OFFLINE="1")
    proc, url, _ = start_server(env, "-hf", "org/Tiny-GGUF:Q8_0", "--no-warmup")
    try:
        assert _call("GET", url + "/v1/models")[1]["data"][0]["id"] == "org/Tiny-GGUF:Q8_0"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    preset = tmp_path / "preset.ini"
    preset.write_text("[tiny-preset]\nhf-repo = org/Tiny-GGUF:Q8_0\nn-predict = 3\n")
    hub = FakeHub({"org/presets": {"preset.ini": preset}})
    try:
        proc, url, lines = start_server(_env(tmp_path, HF_ENDPOINT=hub.url), "-hf", "org/presets", "--temp", "0")
        try:
            assert any("org/presets is a preset repo" in ln for ln in lines)
            ids = {m["id"] for m in _call("GET", url + "/models")[1]["data"]}
            assert {"tiny-preset", "org/Tiny-GGUF:Q8_0"} <= ids
            status, body = _call("POST", url + "/completion", {"model": "tiny-preset", "prompt": "ab"})
            assert status == 200 and body["tokens_predicted"] == 3  # the preset's own n-predict
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    finally:
        hub.close()
