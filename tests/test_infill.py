"""llama-server's `/infill` (server/infill.py): the fill-in-the-middle prompt in llama.cpp's layout
and budgets, served as /completion is; a model without FIM tokens and malformed extra context
are refused in llama-server's words."""

from __future__ import annotations

import json

import pytest
from conftest import make_tiny_model
from test_server import post, start_server

from mlxcel_py.server.infill import CHUNK_SEPARATOR, fim_tokens, infill_prompt

FIM = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>"]
BODY = {
    "input_extra": [{"filename": "llama.h", "text": "LLAMA_API int32_t llama_n_threads();\n"}],
    "input_prefix": '#include <cstdio>\n#include "llama.h"\n\nint main() {\n',
    "prompt": "    int n_threads = llama_",
    "input_suffix": "}\n",
    "n_predict": 8,
    "temperature": 0,
    "ignore_eos": True,
}


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory):
    """A tiny random model whose byte vocabulary also has Qwen's FIM tokens (ids 259-263)."""
    from tokenizers import Tokenizer

    folder = make_tiny_model(tmp_path_factory.mktemp("fim") / "model", seed=3, vocab=264, scale=2.5)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens(FIM)
    tok.save(str(folder / "tokenizer.json"))
    # a window past llama-server's batch (2048) leaves room for the extra context, as it budgets it
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8192}))
    return folder


@pytest.fixture(scope="module")
def servers(fim_model, tiny_dir, tmp_path_factory):
    import os

    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path_factory.mktemp("cfg")))
    procs = [start_server(env, "-m", str(m), "--no-warmup") for m in (fim_model, tiny_dir)]
    yield procs[0][1], procs[1][1]
    for proc, _, _ in procs:
        proc.terminate()
        proc.wait(timeout=30)


def test_infill_builds_llama_servers_prompt_and_decodes_it_as_completion_does(servers):
    url, _ = servers
    status, r = post(url + "/infill", {**BODY, "return_tokens": True})
    assert status == 200
    assert r["prompt"] == (
        "<|repo_name|>myproject\n<|file_sep|>llama.h\nLLAMA_API int32_t llama_n_threads();\n"
        '<|file_sep|>filename\n<|fim_prefix|>#include <cstdio>\n#include "llama.h"\n\nint main() {\n'
        "    int n_threads = llama_<|fim_suffix|>}\n<|fim_middle|>"
    )
    assert r["timings"]["predicted_n"] == 8 and len(r["tokens"]) == 8
    status, plain = post(
        url + "/completion", {"prompt": r["prompt"], "n_predict": 8, "temperature": 0, "ignore_eos": True}
    )
    assert status == 200 and plain["content"] == r["content"]


@pytest.mark.parametrize(
    "extra,message",
    [
        ({}, 'extra_context chunk must contain a "text" field'),
        ({"filename": "ok"}, 'extra_context chunk must contain a "text" field'),
        ({"filename": 123}, 'extra_context chunk must contain a "text" field'),
        ({"filename": 123, "text": "abc"}, 'extra_context chunk\'s "filename" field must be a string'),
        ({"filename": 123, "text": 456}, 'extra_context chunk must contain a "text" field'),
    ],
)
def test_malformed_extra_context_is_refused(servers, extra, message):
    url, _ = servers
    status, err = post(url + "/infill", {**BODY, "input_extra": [extra]})
    assert status == 400 and message in err["error"]["message"]


def test_a_missing_prefix_and_a_model_without_fim_tokens_are_refused(servers):
    url, plain_url = servers
    status, err = post(url + "/infill", {"input_suffix": "x"})
    assert status == 400 and "input_prefix" in err["error"]["message"]
    status, err = post(plain_url + "/infill", BODY)
    assert status == 501 and err["error"]["type"] == "not_supported_error"
    assert err["error"]["message"] == (
        "Infill is not supported by this model: prefix token is missing. suffix token is missing. "
        "middle token is missing. "
    )
    assert post(plain_url + "/completion", {"prompt": "still serving", "n_predict": 2})[0] == 200


def test_budgets_keep_the_prefix_end_the_suffix_start_and_the_extra_end():
    fim = {"pre": 1, "suf": 2, "mid": 3, "rep": None, "sep": None}
    enc = lambda text: [ord(c) for c in text]  # noqa: E731
    ids = infill_prompt(
        fim,
        enc,
        prefix=list(range(100, 140)),
        suffix=list(range(200, 240)),
        extra=[{"text": "ab"}],
        prompt=[7, 8],
        n_ctx=64 + 40,
        n_predict=10,
        bos=0,
        n_batch=64,
    )
    extra = (enc(CHUNK_SEPARATOR) + enc("ab"))[-(104 - 64 - 20) :]  # the window less a batch and 2 n_predict
    assert ids == [*extra, 0, 1, *range(140 - 40, 140), 7, 8, 2, *range(200, 212), 3]
    assert fim_tokens({"<fim_prefix>": 5, "<|fim_prefix|>": 9, "<SUF>": 4}) == {
        "pre": 9,
        "suf": 4,
        "mid": None,
        "rep": None,
        "sep": None,
    }
