"""serve --reranking (llama-server's /rerank for causal-LM rerankers): the judge prompt, the
score (the model's next-token odds of "yes" against "no"), and the routes over a real socket on
the default model, in llama.cpp's test_rerank.py shapes (Jina's `documents`, TEI's `texts`,
`top_n`, usage, refusals).

SmolLM2-135M is no reranker, so its scores are not expected to rank well; what is checked is that
each score is the model's own (the same number an independent forward gives) and that the routes
order, cut and count what they return.
"""

from __future__ import annotations

import math
import os
import urllib.error
import urllib.request

import mlx.core as mx
import pytest
from test_server import post, start_server
from typer.testing import CliRunner

from mlxcel_py.engine.cache import SequenceCache
from mlxcel_py.engine.rerank import relevance
from mlxcel_py.formats import rerank as rerank_prompt

DOCS = [
    "A machine is a physical system that uses power to apply forces and control movement.",
    "Learning is the process of acquiring new understanding, knowledge and skills.",
    "Machine learning is a field of study in artificial intelligence.",
    "Paris, capitale de la France, est une grande ville europeenne.",
]


def test_the_judge_prompt_and_a_models_own_rerank_template():
    p = rerank_prompt.prompt("what is ML?", "ML is a field of AI.")
    assert p.startswith("<|im_start|>system\nJudge whether the Document meets the requirements")
    assert "<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n" in p
    assert "<Query>: what is ML?\n<Document>: ML is a field of AI.<|im_end|>\n" in p
    assert p.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "<Instruct>: Find code\n" in rerank_prompt.prompt("q", "d", instruction="Find code")
    # a model's template: both filled in once (a query that spells a placeholder stays as written)
    assert rerank_prompt.prompt("{document}", "D", "Q={query} D={document}?") == "Q={document} D=D?"
    named = {"default": "chat", "rerank": "{query}|{document}"}
    assert rerank_prompt.template_of(type("T", (), {"chat_template": named})()) == "{query}|{document}"
    listed = [{"name": "default", "template": "x"}, {"name": "rerank", "template": "r"}]
    assert rerank_prompt.template_of(type("T", (), {"chat_template": listed})()) == "r"
    assert rerank_prompt.template_of(type("T", (), {"chat_template": "plain"})()) is None


def test_a_score_is_the_models_odds_of_yes_against_no(tiny):
    ids = [7, 30, 31, 32, 33, 34, 8, 9]
    yes, no = 121, 110
    got = relevance(tiny.model, ids, yes, no)
    c = SequenceCache(tiny.model)
    row = c.feed(ids)[-1]  # the whole prompt in one block: the same row
    margin = (row[yes] - row[no]).item()
    assert got == pytest.approx(1 / (1 + math.exp(-margin)), abs=1e-6)
    assert 0.0 < got < 1.0
    assert relevance(tiny.model, ids, no, yes) == pytest.approx(1 - got, abs=1e-6)


def test_the_rank_pooling_flag_turns_reranking_on(monkeypatch, tmp_path):
    from mlxcel_py.cli import app
    from mlxcel_py.server import main as server_main

    seen = []
    monkeypatch.setattr(server_main, "run_server", lambda cfg, **kw: seen.append(cfg))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    for argv in (["serve", "--pooling", "rank"], ["serve", "--rerank"], ["serve"]):
        assert CliRunner().invoke(app, argv).exit_code == 0
    assert [(c.options.server.reranking, c.options.server.pooling) for c in seen] == [
        (True, "last"),
        (True, "last"),
        (False, "last"),
    ]


def test_without_the_flag_the_routes_answer_501():
    from test_server_requests import make_client

    client, _ = make_client()
    for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"):
        r = client.post(path, json={"query": "q", "documents": ["d"]})
        assert r.status_code == 501 and "--reranking" in r.json()["error"]["message"]


# ---- the real server ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path_factory.mktemp("cfg")))
    proc, url, _ = start_server(env, "--reranking", "--no-warmup", "-c", "512")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.mark.real
def test_rerank_scores_are_the_models_own_best_first_with_usage(reranker, real):
    status, body = post(reranker + "/rerank", {"query": "Machine learning is", "documents": DOCS})
    assert status == 200 and body["object"] == "list" and body["model"]
    results = body["results"]
    assert sorted(r["index"] for r in results) == [0, 1, 2, 3]
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True) and all(0.0 <= s <= 1.0 for s in scores)
    tok = real.tokenizer
    prompts = [list(tok.encode(rerank_prompt.prompt("Machine learning is", d), add_special_tokens=False)) for d in DOCS]
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    for r in results:  # the number the default model gives in this process, to float rounding
        assert r["relevance_score"] == pytest.approx(relevance(real.model, prompts[r["index"]], yes, no), abs=1e-4)
    n = sum(map(len, prompts))
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}
    mx.clear_cache()


@pytest.mark.real
@pytest.mark.parametrize("top_n,expected", [(None, 4), (2, 2), (4, 4), (99, 4)])
def test_top_n_in_both_shapes(reranker, top_n, expected):
    extra = {} if top_n is None else {"top_n": top_n}
    status, body = post(reranker + "/v1/rerank", {"query": "ML", "documents": DOCS, **extra})
    assert status == 200 and len(body["results"]) == expected
    status, tei = post(reranker + "/rerank", {"query": "ML", "texts": DOCS, **extra})
    assert status == 200 and isinstance(tei, list) and len(tei) == expected
    assert [t["index"] for t in tei] == [r["index"] for r in body["results"]]
    assert [t["score"] for t in tei] == [r["relevance_score"] for r in body["results"]]


@pytest.mark.real
def test_documents_and_texts_come_back_when_asked(reranker):
    status, body = post(
        reranker + "/reranking", {"query": "q", "documents": [{"text": "one"}, "two"], "return_documents": True}
    )
    assert status == 200
    assert {r["index"]: r["document"]["text"] for r in body["results"]} == {0: "one", 1: "two"}
    status, tei = post(reranker + "/v1/reranking", {"query": "q", "texts": ["one", "two"], "return_text": True})
    assert status == 200 and {t["index"]: t["text"] for t in tei} == {0: "one", 1: "two"}
    status, plain = post(reranker + "/rerank", {"query": "q", "documents": ["one"]})
    assert status == 200 and "document" not in plain["results"][0]


@pytest.mark.real
@pytest.mark.parametrize(
    "body,fragment",
    [
        ({"query": "q", "documents": []}, "'documents' must be a non-empty array"),
        ({"query": "q", "documents": None}, "'documents' must be a non-empty array"),
        ({"query": "q", "documents": 123}, "'documents' must be a non-empty array"),
        ({"query": "q", "documents": [1, 2, 3]}, "'documents[0]' must be a string"),
        ({"query": "q", "texts": [None]}, "'texts[0]' must be a string"),
        ({"documents": ["d"]}, "'query' must be a non-empty string"),
        ({"query": 5, "documents": ["d"]}, "'query' must be a non-empty string"),
        ({"query": "q", "documents": ["d"] * 257}, "at most 256 documents"),
        ({"query": "q", "documents": ["d"], "top_n": 0}, "'top_n' must be a positive integer"),
        ({"query": "q", "documents": ["d"], "top_n": "2"}, "'top_n' must be a positive integer"),
        ({"query": "q", "documents": ["d"], "instruction": 7}, "'instruction' must be a string"),
        ({"query": "q", "documents": ["word " * 600]}, "too large to process"),
    ],
)
def test_bad_requests_are_400s_and_the_server_keeps_serving(reranker, body, fragment):
    status, err = post(reranker + "/rerank", body)
    assert status == 400 and fragment in err["error"]["message"]
    assert post(reranker + "/rerank", {"query": "q", "documents": ["d"]})[0] == 200


@pytest.mark.real
def test_embeddings_on_a_reranking_server_are_refused_naming_it(reranker):
    req = urllib.request.Request(
        reranker + "/v1/embeddings", data=b'{"input": "hello"}', headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400 and b"rerank" in e.value.read()


def test_a_gguf_rerank_template_reaches_the_tokenizer_beside_its_chat_template(tmp_path):
    import json

    from conftest import make_tiny_model

    from mlxcel_py.formats.prompting import template_source
    from mlxcel_py.models import loading
    from mlxcel_py.models.gguf.tokenizer import tokenizer_config

    md = {
        "tokenizer.ggml.tokens": ["a", "b"],
        "tokenizer.chat_template": "{{ messages[0]['content'] }}",
        "tokenizer.chat_template.rerank": "Q: {query}\nD: {document}\nRelevant:",
    }
    config = tokenizer_config(md, 2048)
    assert config["chat_template"] == [
        {"name": "default", "template": "{{ messages[0]['content'] }}"},
        {"name": "rerank", "template": "Q: {query}\nD: {document}\nRelevant:"},
    ]
    assert tokenizer_config({"tokenizer.ggml.tokens": ["a"], "tokenizer.chat_template": "t"}, 8)["chat_template"] == "t"
    # written as a model's tokenizer_config, as a GGUF conversion does: both templates load by name
    folder = make_tiny_model(tmp_path / "m")
    cfg_path = folder / "tokenizer_config.json"
    written = json.loads(cfg_path.read_text())
    written["chat_template"] = config["chat_template"]
    cfg_path.write_text(json.dumps(written))
    tok = loading.load(loading.resolve(str(folder))).tokenizer
    assert rerank_prompt.template_of(tok) == "Q: {query}\nD: {document}\nRelevant:"
    assert template_source(tok) == "{{ messages[0]['content'] }}"
    text = rerank_prompt.prompt("cats", "dogs", rerank_prompt.template_of(tok))
    assert text == "Q: cats\nD: dogs\nRelevant:"
