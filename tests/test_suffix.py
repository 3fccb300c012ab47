"""SuffixDecoding (`--draft-kind suffix`): the store (matching, voting, LRU budget, persistence),
exactness through the engine, memory across requests, the CLI and server faces, bench --trace.
Random weights prove exactness and mechanics; acceptance on real text is in the README."""

from __future__ import annotations

import json
import random
import signal
import subprocess

import pytest
from conftest import mlxcel_cmd
from test_engine import engine_for, prompts, run

from mlxcel_py.drafters.suffix import NGRAM_MAX, SuffixDrafter, SuffixStore, draft_from
from mlxcel_py.options import DraftConfig, LookupConfig, SamplingOptions

FP = "260:test"


def draft(store, context, limit=16, factor=1.0, min_prob=0.1):
    return store.propose(context, limit, factor=factor, min_prob=min_prob)[:3]  # (draft, score, match)


# ---- the store -------------------------------------------------------------------------------------


def test_longest_match_drafts_the_continuation_sized_by_the_match():
    s = SuffixStore(1000)
    s.add(list(range(1, 40)))
    toks, score, match = draft(s, [99, 98, 5, 6, 7])
    assert match == 3 and toks == [8, 9, 10]  # factor 1.0: as long as the match
    toks, score, match = draft(s, [2, 3, 4, 5, 6, 7], factor=2.0)
    assert match == 6 and toks == list(range(8, 20)) and score == pytest.approx(12.0)
    assert draft(s, [200, 201])[0] == []


def test_continuations_vote_and_a_split_vote_stops_the_draft():
    s = SuffixStore(1000)
    for tail in ([9, 9, 9], [9, 9, 9], [9, 8, 8]):
        s.add([1, 2, 3, 4] + tail)
    toks, score, _ = draft(s, [1, 2, 3, 4], min_prob=0.5)
    assert toks == [9, 9, 9]  # 3/3 then 2/3 then 2/2
    assert score == pytest.approx(1 + 2 / 3 + 2 / 3)
    t2 = SuffixStore(1000)
    for tail in ([5], [6], [7], [8]):
        t2.add([1, 2, 3] + tail)
    assert draft(t2, [1, 2, 3], min_prob=0.3)[0] == []  # no continuation reaches 30%


def test_a_conversation_that_grows_replaces_its_earlier_turn():
    s = SuffixStore(1000)
    s.add([1, 2, 3, 4])
    s.add([1, 2, 3, 4, 5, 6])
    assert len(s) == 1 and s.tokens == 6
    s.add([7, 8, 9])
    s.add([7, 8, 9])  # an equal sequence is a second vote, not an extension
    assert len(s) == 3


def test_memory_stays_within_the_budget_over_a_long_run():
    rng = random.Random(0)
    s = SuffixStore(5000)
    keep = [rng.randint(0, 255) for _ in range(50)]
    s.add(keep)
    for i in range(400):
        s.add([rng.randint(0, 255) for _ in range(rng.randint(20, 200))])
        if i % 10 == 0:  # the kept sequence keeps voting, so LRU keeps it
            assert draft(s, keep[:10])[0][:3] == keep[10:13]
        assert s.tokens <= 5000
        entries = sum(len(v) for v in s.index.grams.values())
        assert entries <= NGRAM_MAX * (s.tokens + s.stale)
        assert s.stale <= max(s.tokens, 1024) + 200
    assert keep in s.seqs.values()


def test_saved_store_round_trips(tmp_path):
    s = SuffixStore(1000)
    s.add([1, 2, 3, 4, 5])
    s.add([6, 7, 8])
    path = tmp_path / "store.json"
    s.save(path, FP)
    t = SuffixStore.load(path, FP, 1000)
    assert list(t.seqs.values()) == [[1, 2, 3, 4, 5], [6, 7, 8]]
    assert draft(t, [2, 3])[0] == draft(s, [2, 3])[0] == [4, 5]
    assert oct(path.stat().st_mode & 0o777) != oct(0o600)  # an ordinary file, not a private temp


@pytest.mark.parametrize(
    "content,reason",
    [
        (b"\x00\xff\xfe", "is not UTF-8 text"),
        (b"{oops", "not valid JSON"),
        (b'{"format": "something-else"}', "not an mlxcel suffix store"),
        (b'{"format": "mlxcel-suffix-store", "version": 99}', "store version 99"),
        (
            b'{"format": "mlxcel-suffix-store", "version": 1, "tokenizer": "other", "sequences": []}',
            "another tokenizer",
        ),
        (
            b'{"format": "mlxcel-suffix-store", "version": 1, "tokenizer": "260:test", "sequences": [[1, -2]]}',
            "lists of token ids",
        ),
        (
            b'{"format": "mlxcel-suffix-store", "version": 1, "tokenizer": "260:test", "sequences": [[1, 100000000000]]}',
            "below the vocabulary size \\(260\\)",
        ),
    ],
)
def test_corrupt_or_foreign_store_is_refused(tmp_path, content, reason):
    path = tmp_path / "store.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=reason):
        SuffixStore.load(path, FP, 1000, vocab_size=260)


def test_live_context_never_matches_its_own_suffix():
    d = SuffixDrafter(SuffixStore(100))
    d.begin([1, 2, 3, 9, 1, 2, 3])
    toks, match, _ = d._best(d.tokens, 8)
    assert toks[:1] == [9] and match == 3
    assert draft_from([4, 5, 6], d.live, {0: d.tokens}, 8, factor=1.0, min_prob=0.1)[0] == []


# ---- the engine --------------------------------------------------------------------------------------


def suffix_config(block=16):
    return DraftConfig(kind="suffix", block_size=block, lookup=LookupConfig(max_draft=block, policy="cost"))


def test_suffix_equals_plain_and_learns_across_requests(tiny):
    plain = engine_for(tiny)
    spec = engine_for(tiny, suffix_config())
    spec.warmup(calibrate=True)
    proposed = accepted = 0
    for i, p in enumerate(prompts(8, seed=31)):
        for sampling in (SamplingOptions(), SamplingOptions(temp=0.8, seed=i)):
            a, _ = run(plain, p, max_tokens=32, sampling=sampling)
            b, g = run(spec, p, max_tokens=32, sampling=sampling)
            assert a == b
            assert g.stats.draft_kind == "suffix"
            proposed, accepted = proposed + g.stats.proposed, accepted + g.stats.accepted
    assert proposed > accepted > 0
    # the same task again: the store holds the first answer, so most of the second is drafted
    p = prompts(1, seed=77)[0]
    first, g1 = run(spec, p, max_tokens=40, ignore_eos=True)
    again, g2 = run(spec, p, max_tokens=40, ignore_eos=True)
    assert first == again
    # how much a round may propose is the calibrated policy's (timing-dependent) choice; what the
    # store changes is whether the proposals are right
    assert g2.stats.accepted > g1.stats.accepted and g2.stats.accepted >= 0.7 * g2.stats.proposed


# ---- the commands ------------------------------------------------------------------------------------


def cli(args, env, input=None):
    return subprocess.run(mlxcel_cmd() + args, capture_output=True, text=True, env=env, input=input, timeout=300)


def test_generate_saves_the_store_and_the_next_run_drafts_from_it(tiny_dir, cli_env, tmp_path):
    store = tmp_path / "s.json"
    args = [
        "generate",
        "-m",
        str(tiny_dir),
        "-p",
        "once upon a time",
        "-n",
        "40",
        "--ignore-eos",
        "--draft-kind",
        "suffix",
        "--suffix-store",
        str(store),
        "-v",
    ]
    plain = cli(["generate", "-m", str(tiny_dir), "-p", "once upon a time", "-n", "40", "--ignore-eos"], cli_env)
    first = cli(args, cli_env)
    assert first.returncode == 0, first.stderr
    assert store.is_file() and "saved to" in first.stderr
    second = cli(args, cli_env)
    assert second.returncode == 0 and second.stdout == first.stdout == plain.stdout
    assert "suffix store: 1 sequences" in second.stderr  # loaded at start
    acc = [
        int(line.split("accepted=")[1].split()[0])
        for r in (first, second)
        for line in r.stderr.splitlines()
        if line.startswith("[Speculative acceptance]")
    ]
    assert acc[1] > acc[0]
    assert len(json.loads(store.read_text())["sequences"]) == 2  # the same answer twice: counted twice


def test_a_corrupt_or_foreign_store_file_is_one_line_error(tiny_dir, cli_env, tmp_path):
    store = tmp_path / "s.json"
    for content, reason in [
        ("{oops", "not valid JSON"),
        (
            '{"format": "mlxcel-suffix-store", "version": 1, "tokenizer": "9:x", "sequences": []}',
            "saved for another tokenizer",
        ),
    ]:
        store.write_text(content)
        r = cli(
            [
                "generate",
                "-m",
                str(tiny_dir),
                "-p",
                "x",
                "-n",
                "4",
                "--draft-kind",
                "suffix",
                "--suffix-store",
                str(store),
            ],
            cli_env,
        )
        assert r.returncode == 1 and "Traceback" not in r.stderr
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and f"--suffix-store {store}" in errors[0] and reason in errors[0]
        assert store.read_text() == content  # the user's file is left as it was


def test_chat_keeps_the_store_across_turns_and_runs(tiny_dir, cli_env, tmp_path):
    store = tmp_path / "chat.json"
    r = cli(
        ["chat", "-m", str(tiny_dir), "-n", "16", "--draft-kind", "suffix", "--suffix-store", str(store), "--profile"],
        cli_env,
        input="tell me a story\ntell me a story\n",
    )
    assert r.returncode == 0, r.stderr
    assert "suffix" in r.stderr and store.is_file()
    seqs = json.loads(store.read_text())["sequences"]
    # the second turn's prompt holds the first turn; it replaces it when the reply re-encodes to the
    # same tokens (this byte tokenizer's random bytes need not), else both are kept
    assert 1 <= len(seqs) <= 2 and max(len(q) for q in seqs) > 2 * 16
    turns = [line for line in r.stderr.splitlines() if "tokens," in line and "suffix:" in line]
    assert len(turns) == 2


def test_serve_suffix_timings_and_store_saved_on_sigterm(tiny_dir, cli_env, tmp_path):
    from test_server import post, start_server

    store = tmp_path / "srv.json"
    proc, url, lines = start_server(
        cli_env, "-m", str(tiny_dir), "--draft-kind", "suffix", "--suffix-store", str(store)
    )
    try:
        body = {"prompt": "the same request", "max_tokens": 32, "temperature": 0, "ignore_eos": True}
        s1, r1 = post(url + "/v1/completions", body)
        s2, r2 = post(url + "/v1/completions", body)
        assert s1 == s2 == 200
        assert r1["choices"][0]["text"] == r2["choices"][0]["text"]
        assert r2["timings"]["draft_kind"] == "suffix"
        assert r2["timings"]["draft_n_accepted"] > r1["timings"]["draft_n_accepted"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert json.loads(store.read_text())["sequences"]


def test_bench_trace_replays_turns_through_one_engine(tiny_dir, cli_env, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"source": "t", "turns": ["write abc", "again", "once more"]}) + "\n")
    out = tmp_path / "b.json"
    r = cli(
        [
            "bench",
            "-m",
            str(tiny_dir),
            "--trace",
            str(trace),
            "--draft-kind",
            "suffix",
            "--prompt-lookup",
            "--max-tokens",
            "16",
            "--json",
            str(out),
        ],
        cli_env,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["configs"] == ["plain", "suffix k=16", "prompt-lookup k=7"] and data["trace"] is True
    kinds = {s["kind"] for s in data["summary"]}
    assert kinds == {"turn 1", "turn 2", "turn 3", "all"}
    assert all(s["identical"] == s["prompts"] for s in data["summary"])
    bad = cli(["bench", "-m", str(tiny_dir), "--trace", str(trace), "--workload", str(trace)], cli_env)
    assert bad.returncode == 2 and "--trace and --workload" in bad.stderr


@pytest.mark.real
def test_real_model_trace_turns_equal_plain_for_suffix_and_lookup(cli_env, tmp_path):
    """Greedy output equals plain decoding on every turn of a shared trace, both drafters."""
    from conftest import ROOT

    trace = tmp_path / "t.jsonl"
    line = (ROOT / "benchmarks" / "traces.jsonl").read_text().splitlines()[1]
    obj = json.loads(line)
    trace.write_text(json.dumps({"source": obj["source"], "turns": obj["turns"][:2]}) + "\n")
    out = tmp_path / "b.json"
    r = cli(
        [
            "bench",
            "--trace",
            str(trace),
            "--draft-kind",
            "suffix",
            "--prompt-lookup",
            "--max-tokens",
            "32",
            "--json",
            str(out),
        ],
        cli_env,
    )
    assert r.returncode == 0, r.stderr
    summary = json.loads(out.read_text())["summary"]
    assert {s["config"] for s in summary} == {"suffix k=16", "prompt-lookup k=7"}
    assert all(s["identical"] == s["prompts"] for s in summary)


def test_cost_policy_pauses_suffix_drafts_that_stop_paying(tiny, monkeypatch):
    """A store that always has a continuation, nearly always wrong: the cost policy soon declines.

    The verify costs are fixed (a width-w block costs 1 + 0.3 (w - 1) plain steps, the order of the
    default model's on this CPU) instead of timed: on this tiny model a wide block costs about one
    step, so whether the timed policy declined depended on timing noise."""
    from mlxcel_py.engine.policy import CostPolicy

    rng = random.Random(3)
    perm = list(range(256))
    rng.shuffle(perm)
    spec = engine_for(tiny, suffix_config())
    spec.verify_cost = [0.0] + [1.0 + 0.3 * (w - 1) for w in range(1, 18)]
    monkeypatch.setattr(CostPolicy, "timed", lambda self, width, seconds: None)
    for _ in range(3):
        spec.remember(perm * 2)
    plain = engine_for(tiny)
    p = prompts(1, seed=5)[0]
    a, _ = run(plain, p, max_tokens=80, ignore_eos=True)
    b, g = run(spec, p, max_tokens=80, ignore_eos=True)
    assert a == b
    assert g.stats.drafted_rounds > 0 and g.stats.acceptance_rate < 0.5
    assert g.stats.paused_rounds > 0  # the policy declined rounds
