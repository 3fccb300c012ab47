"""A full context window on serve, as llama-server reports it: a generation that fills the window
stops there with `truncated: true`, and a prompt over it is refused in llama-server's words
("exceeds the available context size"), which clients match to trim and retry."""

from __future__ import annotations

import pytest
from test_server import post, start_server

CTX = 64


@pytest.fixture(scope="module")
def small_server(tiny_dir, tmp_path_factory):
    import os

    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path_factory.mktemp("cfg")))
    proc, url, _ = start_server(env, "-m", str(tiny_dir), "-c", str(CTX), "--no-warmup")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def test_a_generation_that_fills_the_window_is_truncated_and_a_short_one_is_not(small_server):
    prompt = {"prompt": "Hi how are you", "ignore_eos": True}
    status, full = post(small_server + "/completion", {**prompt, "n_predict": -1})
    assert status == 200
    n_prompt = full["timings"]["prompt_n"]
    assert full["timings"]["predicted_n"] == CTX - n_prompt  # llama-server's count: prompt + output = window
    assert full["truncated"] is True and full["stop_type"] == "limit"
    status, short = post(small_server + "/completion", {**prompt, "n_predict": 5})
    assert status == 200 and short["timings"]["predicted_n"] == 5
    assert short["truncated"] is False and short["stop_type"] == "limit"


def test_a_prompt_over_the_window_is_refused_in_llama_server_words(small_server):
    status, err = post(small_server + "/completion", {"prompt": "x" * (CTX + 10), "n_predict": 4})
    assert status == 400 and err["error"]["type"] == "exceed_context_size_error"
    assert "exceeds the available context size" in err["error"]["message"]
    assert err["error"]["n_prompt_tokens"] > err["error"]["n_ctx"] == CTX
    status, ok = post(small_server + "/completion", {"prompt": "still serving", "n_predict": 2})
    assert status == 200 and ok["timings"]["predicted_n"] == 2


def test_generation_settings_list_logit_biases_as_llama_server_and_ignore_eos_bans_the_eog(small_server):
    """llama-server's form, `{"bias", "token"}` with a ban as null; `ignore_eos` shows the
    end-of-generation tokens banned, as llama-server adds them to the request's biases."""
    status, plain = post(small_server + "/completion", {"prompt": "Hi", "n_predict": 2, "logit_bias": {"5": 2.0}})
    assert status == 200 and plain["generation_settings"]["logit_bias"] == [{"bias": 2.0, "token": 5}]
    status, banned = post(small_server + "/completion", {"prompt": "Hi", "n_predict": 2, "ignore_eos": True})
    biases = banned["generation_settings"]["logit_bias"]
    assert status == 200 and biases and all(b["bias"] is None for b in biases)
    assert 258 in {b["token"] for b in biases}  # the tiny model's <|im_end|>, its EOS


@pytest.fixture(scope="module")
def shifting_server(tiny_dir, tmp_path_factory):
    """--context-shift on two slots sharing the window (-kvu): requests run under the scheduler."""
    import os

    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path_factory.mktemp("cfg")))
    args = ["-m", str(tiny_dir), "-c", str(CTX), "--context-shift", "--keep", "2", "-np", "2", "-kvu"]
    proc, url, _ = start_server(env, *args, "--no-warmup")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def test_context_shift_goes_past_the_window_with_the_engines_tokens(shifting_server, tiny):
    from concurrent.futures import ThreadPoolExecutor

    from test_engine import engine_for, run

    from mlxcel_py.engine.context_shift import ContextShift

    body = {"prompt": "Hi how are you", "n_predict": 150, "ignore_eos": True, "return_tokens": True, "temperature": 0}
    status, r = post(shifting_server + "/completion", body)
    assert status == 200 and r["timings"]["predicted_n"] == 150 and r["truncated"] is True
    assert r["generation_settings"]["n_keep"] == 2
    eng = engine_for(tiny)
    eng.context_length = CTX
    prompt = tiny.tokenizer.encode("Hi how are you")
    want, g = run(eng, prompt, max_tokens=150, ignore_eos=True, context_shift=ContextShift(keep=2))
    assert g.stats.context_shifts >= 3 and r["tokens"] == want
    # two at once, each shifting between the other's steps: each gets its solo tokens
    other = {**body, "prompt": "Another prompt", "n_keep": -1, "n_discard": 9}
    status, solo = post(shifting_server + "/completion", other)
    assert status == 200 and solo["generation_settings"]["n_discard"] == 9
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda b: post(shifting_server + "/completion", b), [body, other]))
    assert [x[1]["tokens"] for x in both] == [r["tokens"], solo["tokens"]]


def test_n_keep_and_n_discard_out_of_range_are_refused(shifting_server):
    for field, value in (("n_keep", -2), ("n_discard", -1)):
        status, err = post(shifting_server + "/completion", {"prompt": "Hi", field: value})
        assert status == 400 and field in err["error"]["message"]


def test_post_sampling_probs_are_the_samplers_distribution(small_server):
    """llama-server's `post_sampling_probs`: `prob`/`top_probs` after the sampler chain, without the
    tokens it ruled out (llama.cpp's test_n_probs_post_sampling: no 0.0 entries, and fewer than
    n_probs only when they sum to 1). Greedy puts everything on the token it picks; top-k 3
    leaves three tokens whose probabilities sum to 1."""
    body = {"prompt": "Hi there", "n_predict": 4, "n_probs": 5, "post_sampling_probs": True, "ignore_eos": True}
    status, r = post(small_server + "/completion", {**body, "temperature": 0})
    assert status == 200 and len(r["completion_probabilities"]) == 4
    for tok in r["completion_probabilities"]:
        assert tok["prob"] == 1.0 and "logprob" not in tok
        assert [(p["id"], p["prob"]) for p in tok["top_probs"]] == [(tok["id"], 1.0)]
    r_greedy = r["completion_probabilities"]
    status, r = post(
        small_server + "/completion", {**body, "temperature": 1.0, "top_k": 3, "top_p": 1.0, "min_p": 0, "seed": 3}
    )
    assert status == 200
    for tok in r["completion_probabilities"]:
        probs = [p["prob"] for p in tok["top_probs"]]
        assert len(probs) == 3 and all(p > 0 for p in probs) and abs(sum(probs) - 1) < 1e-4 and tok["prob"] in probs
    greedy_ids = [[p["id"] for p in tok["top_probs"]] for tok in r_greedy]
    status, plain = post(small_server + "/completion", {**body, "temperature": 0, "post_sampling_probs": False})
    assert "logprob" in plain["completion_probabilities"][0] and plain["completion_probabilities"][0]["logprob"] < 0
    # greedy's one token is the model's most likely
    assert greedy_ids == [[tok["top_logprobs"][0]["id"]] for tok in plain["completion_probabilities"]]
