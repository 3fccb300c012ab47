"""Draft trees (engine/tree.py, --draft-tree-budget): several candidate continuations verified in
one target forward.

The tree itself (depths, paths, the walk, sizing, merging), each builder's trees (prompt lookup,
suffix, runner-ups, best first), greedy output with trees equal to plain decoding token for token
for every builder that can run here (prompt lookup and suffix on tiny and real models, a full
draft model, DFlash, EAGLE-3; the MTP builder at the drafter level, since every MTP family's
caches refuse trees), branches actually taken on the real model, every refusal (flags before any
model loads, models whose caches follow one branch), and the CLI, server, bench and API faces.
The kernel side (tree rows equal their paths' one-token steps bit for bit, the cache a tree round
leaves) is in test_decoder_layers.py, which also runs on the kernel's AVX2 build.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from dataclasses import replace

import mlx.core as mx
import pytest
import tiny_models
from conftest import mlxcel_cmd
from test_engine import engine_for, lookup, prompts, run

from mlxcel_py.bench.checks import validate_bench
from mlxcel_py.commands._options import build_options
from mlxcel_py.cpu import extension as cpu_extension
from mlxcel_py.drafters import registry
from mlxcel_py.drafters.branching import best_first, runner_ups
from mlxcel_py.drafters.prompt_lookup import PromptLookupIndex
from mlxcel_py.drafters.suffix import SuffixStore
from mlxcel_py.engine.tree import DraftTree, layout, merge
from mlxcel_py.errors import ModelError, UsageError
from mlxcel_py.options import DraftConfig, SamplingOptions
from mlxcel_py.session import open_session
from mlxcel_py.validate import validate

QMM, WHY = cpu_extension.kernel_status()
needs_kernel = pytest.mark.skipif(QMM is None, reason=f"row-exact kernel: {WHY}")


# ---- the tree ------------------------------------------------------------------------------------
def test_a_tree_knows_its_depths_paths_children_and_first_chain():
    t = DraftTree((1, 2, 3, 4, 5), (-1, 0, 1, -1, 3))
    assert t.depths == [1, 2, 3, 1, 2]
    assert t.path(2) == [0, 1, 2] and t.path(4) == [3, 4]
    assert t.children() == [[1], [2], [], [4], [], [0, 3]]  # the root's last
    assert t.chain_length == 3 and not t.is_chain
    assert DraftTree.chain([7, 8]).is_chain and DraftTree.chain([7, 8]).parents == (-1, 0)
    with pytest.raises(ValueError, match="not an earlier node"):
        DraftTree((1, 2), (-1, 1))
    with pytest.raises(ValueError, match="one parent per token"):
        DraftTree((1, 2), (-1,))


def test_the_walk_follows_the_targets_choices_through_branches():
    t = DraftTree((1, 2, 3, 4, 5), (-1, 0, 1, -1, 3))
    choices = {0: 4, 4: 5, 5: 9}  # row -> the target's token: root picks 4, node 3 picks 5, node 4 picks 9
    path, token = t.walk(lambda row, toks: choices[row])
    assert path == [3, 4] and token == 9
    path, token = t.walk(lambda row, toks: {0: 1, 1: 2, 2: 7}[row])
    assert path == [0, 1] and token == 7
    seen = []
    t.walk(lambda row, toks: seen.append(toks) or 6)  # nothing matches 6: the root's row only
    assert seen == [[]]


def test_merge_keeps_the_first_branch_as_the_chain_then_shallowest_first():
    t = merge([[1, 2, 3], [1, 4, 5], [6, 7], [1, 2, 3]])
    assert t.tokens == (1, 2, 3, 6, 4, 7, 5)
    assert t.parents == (-1, 0, 1, -1, 0, 3, 4)
    assert t.chain_length == 3
    assert merge([[1, 2], [1, 2]]).is_chain


def test_sized_cuts_the_chain_to_the_policy_and_keeps_the_best_extra_nodes():
    t = merge([[1, 2, 3, 4], [1, 5, 6], [7, 8], [1, 2, 9]])  # extra nodes: 7, 5, 9, 8, 6
    s = t.sized(2, 2, 10)  # chain 1 2; extras 7 and 5 (best first); 9 hangs off 2 but over budget
    assert s.tokens == (1, 2, 7, 5) and s.parents == (-1, 0, -1, 0)
    s = t.sized(1, 10, 10)  # node 2 cut: 9 (its child) goes too
    assert s.tokens == (1, 7, 5, 8, 6) and s.parents == (-1, -1, 0, 1, 2)
    assert t.sized(4, 10, 2).tokens == (1, 2, 7, 5, 8)  # at most 2 deep
    assert t.sized(4, 0, 10).is_chain


def test_ended_drops_what_follows_an_end_of_sequence_token():
    t = merge([[1, 2, 3], [4, 0, 5], [4, 6]])
    e = t.ended(lambda tok: tok == 0)
    assert e.tokens == (1, 2, 3, 4, 0, 6) and 5 not in e.tokens


def test_layout_rotates_rows_at_their_depth_and_lists_ancestors():
    t = DraftTree((1, 2, 3, 4), (-1, 0, -1, 2))
    lay = layout(10, t)
    assert lay.pos == [10, 11, 12, 11, 12]  # the root at the cache's end, nodes at their depths
    assert lay.slot == [10, 11, 12, 13, 14]
    # nodes 0, 1 follow the root as a chain would (a prefix); nodes 2, 3 see the root, then themselves
    assert lay.base == [11, 12, 13, 11, 11]
    assert lay.tail == [[], [], [], [13], [13, 14]]


# ---- builders ------------------------------------------------------------------------------------
def test_prompt_lookup_tree_offers_every_recent_continuation_of_the_match():
    idx = PromptLookupIndex(2, 3)
    ctx = [1, 2, 3, 10, 11, 9, 1, 2, 3, 20, 21, 9, 1, 2, 3, 30, 31, 9, 1, 2, 3]
    idx.reset(ctx)
    chain, match, tree = idx.find_tree(3)
    assert (chain, match) == idx.find_match(3) and chain == [30, 31, 9]  # the latest occurrence first
    assert tree.chain_length == 3 and tree.tokens[:3] == (30, 31, 9)
    firsts = {tree.tokens[i] for i, p in enumerate(tree.parents) if p < 0}
    assert firsts == {30, 20, 10}
    idx.reset([5, 6, 7, 8, 5, 6])
    assert idx.find_tree(4)[2] is None  # one occurrence: a chain


def test_suffix_tree_branches_where_earlier_sequences_disagree():
    s = SuffixStore(10_000)
    for tail in ([7, 8, 9], [7, 8, 9], [7, 5, 6], [4, 4, 4]):
        s.add([1, 2, 3, *tail])
    toks, score, match, tree = s.propose([0, 1, 2, 3], 3, factor=1.0, min_prob=0.2, nodes=4)
    assert toks == [7, 8, 9]  # the greedy path: 3 of 4 voted 7, then 2 of 3 voted 8
    assert tree.tokens[:3] == (7, 8, 9)
    extras = {(tree.parents[i], tree.tokens[i]) for i in range(3, len(tree))}
    assert (-1, 4) in extras and (0, 5) in extras  # 1/4 and 3/4 * 1/3, both at least 0.2
    assert s.propose([0, 1, 2, 3], 3, factor=1.0, min_prob=0.3, nodes=4)[3] is None  # too unlikely


def test_runner_ups_become_leaves_best_first_within_the_margin():
    rows = [mx.array([[0.0, 5.0, 4.0, -9.0]]), mx.array([[3.0, 0.0, 1.0, 2.9]]), mx.array([[9.0, 0.0, 0.0, 0.0]])]
    t = runner_ups([1, 0, 0], rows, 2.5)  # within 2.5 logits of each pick: 2 at step 0; 3 and 2 at step 1
    assert t.tokens[:3] == (1, 0, 0)
    # best first by path probability: 1-3 (0.73 * 0.43), then 2 (0.27), then 1-2 (0.73 * 0.07)
    assert list(zip(t.parents[3:], t.tokens[3:])) == [(0, 3), (-1, 2), (0, 2)]
    t = runner_ups([1, 0, 0], rows, 0.5)  # only the second step's 2.9 is within 0.5
    assert t.tokens == (1, 0, 0, 3) and t.parents == (-1, 0, 1, 0)
    assert runner_ups([1, 0, 0], rows, 0.05) is None
    assert len(runner_ups([1, 0, 0], rows, math.inf)) == 3 + 9  # three runner-ups a step


def test_best_first_takes_any_path_through_the_blocks_positions():
    logits = mx.log(mx.array([[0.6, 0.4, 0.0, 0.0], [0.5, 0.0, 0.5, 0.0], [0.0, 0.1, 0.0, 0.9]]) + 1e-9)
    t = best_first([0, 0, 3], logits, 3, math.inf)
    assert t.tokens[:3] == (0, 0, 3)
    # best first by path probability: 1 (0.40), 0-2 (0.30), then 0-2-3 (0.27) before 1-0 (0.20)
    assert list(zip(t.parents[3:], t.tokens[3:])) == [(-1, 1), (0, 2), (4, 3)]
    # within 1 logit of each row's best: row 0's 1, row 1's 0 and 2, row 2's 3 alone (0.1 is 2.2 below)
    t = best_first([0, 0, 3], logits, 8, 1.0)
    extra = list(zip(t.parents[3:], t.tokens[3:]))
    assert extra[:3] == [(-1, 1), (0, 2), (4, 3)]
    assert set(extra[3:5]) == {(3, 0), (3, 2)} and [tok for _, tok in extra[5:]] == [3, 3]


# ---- greedy trees equal plain decoding -------------------------------------------------------------
def tree_engine(lm, draft, nodes=8, **kw):
    return engine_for(lm, replace(draft, tree_budget=nodes), **kw)


def equal_with_trees(plain, spec, prompt_list, max_tokens=40, **kw) -> tuple[int, int]:
    """Greedy output with trees equals plain decoding's on every prompt; (tree rounds, branch accepts)."""
    rounds = branches = 0
    for p in prompt_list:
        a, _ = run(plain, p, max_tokens=max_tokens, **kw)
        b, g = run(spec, p, max_tokens=max_tokens, **kw)
        assert a == b
        rounds, branches = rounds + g.stats.tree_rounds, branches + g.stats.branch_accepts
    return rounds, branches


def branchy_prompts(n, seed=0):
    """Prompts that repeat a phrase with several endings (prompt lookup's trees branch there)."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        stem = [rng.randint(0, 255) for _ in range(3)]
        body = []
        for _ in range(4):
            body += stem + [rng.randint(0, 255) for _ in range(rng.randint(2, 6))]
        out.append(body + stem)
    return out


@needs_kernel
@pytest.mark.parametrize("policy", ["graded", "cost"])
def test_prompt_lookup_trees_equal_plain_and_verify_trees(tiny, policy):
    plain, spec = engine_for(tiny), tree_engine(tiny, lookup(policy))
    spec.warmup(calibrate=policy == "cost")
    assert spec.tree_nodes == 8
    rounds, _ = equal_with_trees(plain, spec, branchy_prompts(10) + prompts(6))
    assert rounds > 0


@needs_kernel
def test_trees_decide_each_row_after_its_own_path_under_processors(tiny):
    """A repetition penalty and --min-tokens read each row's own path, not the rows before it."""
    plain, spec = engine_for(tiny), tree_engine(tiny, lookup())
    s = SamplingOptions(repetition_penalty=1.3)
    rounds, _ = equal_with_trees(plain, spec, branchy_prompts(8, seed=3), sampling=s, min_tokens=30)
    assert rounds > 0


@needs_kernel
def test_suffix_trees_equal_plain(tiny):
    draft = DraftConfig(kind="suffix", lookup=replace(lookup("cost").lookup, max_draft=16), block_size=16)
    plain, spec = engine_for(tiny), tree_engine(tiny, draft)
    for p in branchy_prompts(6, seed=5):  # the store learns earlier sequences with other endings
        spec.remember(p + [1, 2, 3])
    rounds, _ = equal_with_trees(plain, spec, branchy_prompts(8, seed=5))
    assert rounds > 0


@needs_kernel
def test_full_model_runner_up_trees_equal_plain(tiny, tiny_draft_dir):
    from mlxcel_py.models import loading

    draft_lm = loading.load(loading.resolve(str(tiny_draft_dir)))
    cfg = DraftConfig(kind="full-model", draft_model=str(tiny_draft_dir), block_size=4)
    plain, spec = engine_for(tiny), tree_engine(tiny, cfg, nodes=3, draft_model=draft_lm)
    rounds, _ = equal_with_trees(plain, spec, prompts(6, seed=2), ignore_eos=True)
    assert rounds > 0


@pytest.fixture(scope="module")
def qwen3_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("trees")
    cfg = tiny_models.QWEN3
    return {
        "qwen3": tiny_models.build(root / "qwen3", cfg, seed=1, scale=0.5),
        "dflash": tiny_models.dflash_checkpoint(root / "dflash", tiny_models.dflash_config(cfg, layers=2)),
        "eagle3": tiny_models.eagle3_checkpoint(root / "eagle3", tiny_models.eagle3_config(cfg)),
    }


def session(target, **params):
    return open_session(validate(build_options("generate", {"prompt": "x", "model": str(target), **params})))


@needs_kernel
@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_dflash_best_first_and_eagle3_runner_up_trees_equal_plain(qwen3_dirs, kind):
    from test_dflash import plain_engine

    s = session(qwen3_dirs["qwen3"], draft_model=str(qwen3_dirs[kind]), draft_tree_budget=6)
    assert s.engine.tree_nodes == 6 and s.engine.draft.kind == kind
    plain = plain_engine(s)
    rounds, _ = equal_with_trees(plain, s.engine, prompts(5, seed=4), max_tokens=32, ignore_eos=True)
    assert rounds > 0


def test_the_mtp_tree_is_its_chain_with_runner_up_leaves(tmp_path):
    """Every MTP family's target refuses trees here (Qwen3.5 and Qwen3-Next are hybrids, Gemma 4
    slides), so the builder is checked at the drafter: its first chain is the chain it proposes."""
    from mlxcel_py.engine.cache import SequenceCache
    from mlxcel_py.engine.sampling import Decider

    target = tiny_models.build(
        tmp_path / "t", tiny_models.QWEN35, extra=tiny_models.mtp_tensors(tiny_models.QWEN35, kind="random")
    )
    s = session(target, draft_kind="mtp")
    tokens = list(range(30, 60))
    got = []
    for tree in (False, True):
        drafter = s.engine.drafters.new_drafter()
        cache = SequenceCache(s.engine.model)
        cache.keep_hidden(drafter.hidden_tap)
        cache.prefill(tokens[:-1])
        drafter.begin(tokens, cache)
        decider = Decider(SamplingOptions(), prompt_len=len(tokens))
        got.append(drafter.propose_tree(tokens, 4, decider, 8) if tree else drafter.propose(tokens, 4, decider))
    chain, with_tree = got
    t = with_tree.tree
    assert with_tree.tokens == chain.tokens and t.tokens[:4] == tuple(chain.tokens)
    leaves = list(zip(t.parents[4:], t.tokens[4:]))
    assert sorted(p for p, _ in leaves) == [-1] * 3 + [0] * 3 + [1] * 3 + [2] * 3  # three runner-ups a step
    assert all(tok != chain.tokens[p + 1] for p, tok in leaves)  # each beside the chain's token


@pytest.mark.real
@needs_kernel
def test_real_model_trees_equal_plain_and_take_branches(real, workloads):
    """On the default model and the public workload, prompt-lookup trees equal plain decoding and
    some rounds accept a path off the tree's first chain."""
    plain, spec = engine_for(real), tree_engine(real, lookup("cost", max_draft=12), nodes=4)
    spec.warmup(calibrate=True)
    tok = real.tokenizer
    ids = [
        tok.apply_chat_template([{"role": "user", "content": w["prompt"]}], add_generation_prompt=True)
        for w in workloads
        if w["kind"] in ("code", "edit")
    ][:6]
    rounds, branches = equal_with_trees(plain, spec, ids, max_tokens=96)
    assert rounds > 0 and branches > 0


@pytest.mark.real
@needs_kernel
def test_real_model_suffix_and_full_model_trees_equal_plain(real, workloads):
    """The default model with suffix trees (the store holds the other prompts) and with a weak
    full-model drafter (the model cut to its first 6 layers), whose runner-ups fill the tree."""
    from mlxcel_py.models import loading

    tok = real.tokenizer
    ids = [
        tok.apply_chat_template([{"role": "user", "content": w["prompt"]}], add_generation_prompt=True)
        for w in workloads
    ]
    plain = engine_for(real)
    suffix = tree_engine(real, DraftConfig(kind="suffix", lookup=lookup("cost").lookup, block_size=16), nodes=4)
    for p in ids[4:]:
        suffix.remember(p)
    assert equal_with_trees(plain, suffix, ids[:3], max_tokens=64)[0] > 0
    cut = loading.load(real.resolved)
    cut.model.model.layers = cut.model.model.layers[:6]
    full = tree_engine(
        real, DraftConfig(kind="full-model", draft_model="cut", block_size=3), nodes=3, draft_model=cut.model
    )
    rounds, branches = equal_with_trees(plain, full, ids[:2], max_tokens=48)
    assert rounds > 0


# ---- refusals (the flag rules are in test_validate.py, with docs/validation.md) -------------------
def opts(command="generate", **params):
    base = {"prompt": "x"} if command in ("generate", "run") else {}
    return build_options(command, {**base, **params})


def test_mtp_takes_mlxcels_environment_names_and_flags_win():
    d = validate(opts(draft_kind="mtp", mtp_tree_branches="3", mtp_tree_margin="1.5")).draft
    assert (d.tree_budget, d.tree_margin) == (3, 1.5)
    assert "tree=3 nodes, margin=1.5" in registry.describe(d)
    d = validate(opts(draft_kind="mtp", mtp_tree_branches="3", draft_tree_budget=5)).draft
    assert d.tree_budget == 5
    # mtp's names only: another kind ignores them, even a value that is not a number
    assert validate(opts(prompt_lookup=True, mtp_tree_branches="3")).draft.tree_budget == 0
    assert validate(opts(prompt_lookup=True, mtp_tree_branches="many")).draft.tree_budget == 0
    with pytest.raises(UsageError, match="MLXCEL_MTP_TREE_BRANCHES='many' is not a whole number"):
        validate(opts(draft_kind="mtp", mtp_tree_branches="many"))
    with pytest.raises(UsageError, match="MLXCEL_MTP_TREE_MARGIN='wide' is not a logit gap"):
        validate(opts(draft_kind="mtp", mtp_tree_branches="2", mtp_tree_margin="wide"))


def test_serve_says_that_sampled_requests_verify_chains():
    run_cfg = validate(opts("serve", draft_kind="prompt-lookup", draft_tree_budget=4))
    assert any("greedy requests" in w for w in run_cfg.warnings)
    run_cfg = validate(opts("serve", draft_kind="prompt-lookup", draft_tree_budget=4, temp=0.0))
    assert not any("greedy requests" in w for w in run_cfg.warnings)


def test_a_hybrid_target_is_refused_before_any_weight_loads(tmp_path, no_weights):
    target = tiny_models.build(tmp_path / "h", tiny_models.QWEN35)
    with pytest.raises(ModelError, match=r"draft trees need .* caches are .*state"):
        session(target, prompt_lookup=True, draft_tree_budget=4)


@needs_kernel
def test_the_float32_path_is_refused_once_loaded(tiny_dir):
    with pytest.raises(ModelError, match="row-exact CPU kernel does not carry"):
        session(tiny_dir, prompt_lookup=True, draft_tree_budget=4, cpu_weights="f32")


def test_bench_plans_each_drafter_at_each_tree_budget():
    """(the refused lists are rules in test_validate.py)"""
    from mlxcel_py.options import BenchOptions

    plan = validate_bench(opts("bench", prompt_lookup=True, max_tokens=16), BenchOptions(tree_budgets="0,4"))
    assert [registry.label(d) for d in plan.drafts] == ["prompt-lookup k=7", "prompt-lookup k=7 tree=4"]


# ---- the CLI, server, bench and API faces --------------------------------------------------------
def mlxcel(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(mlxcel_cmd() + list(args), capture_output=True, text=True, env=env, timeout=300)


def generate_args(model, prompt: str, n: int) -> list[str]:
    return ["generate", "-m", str(model), "-p", prompt, "-n", str(n), "--ignore-eos", "--no-chat-template"]


@needs_kernel
def test_cli_generate_with_trees_equals_plain_and_reports_them(tiny_dir, cli_env):
    args = generate_args(tiny_dir, " ".join(["abc def ghi", "abc xyz", "abc def jkl", "abc xyz uvw", "abc"] * 3), 40)
    plain = mlxcel(cli_env, *args)
    spec = mlxcel(cli_env, *args, "--prompt-lookup", "--draft-tree-budget", "6", "--profile")
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout
    assert "speculative=prompt-lookup (max_draft=7, ngram=2..3, policy=graded, tree=6 nodes)" in spec.stderr
    assert re.search(r"^Tree rounds +[1-9]", spec.stderr, re.M)
    bad = mlxcel(cli_env, *args, "--prompt-lookup", "--draft-tree-budget", "4", "--temp", "0.5")
    assert bad.returncode == 2 and "verified greedily only" in bad.stderr and "Traceback" not in bad.stderr
    # mtp's name: another kind ignores it
    same = mlxcel(dict(cli_env, MLXCEL_MTP_TREE_BRANCHES="2"), *args, "--prompt-lookup")
    assert same.returncode == 0 and same.stdout == plain.stdout and "tree=" not in same.stderr


@needs_kernel
def test_serve_batches_tree_rounds_beside_other_requests_exactly(tiny_dir, cli_env):
    """-np 2: two greedy requests' tree rounds ride in one ragged forward; each equals the plain
    CLI's output, and timings count the tree rounds. A sampled request still verifies chains."""
    from concurrent.futures import ThreadPoolExecutor

    from test_server import post, start_server

    proc, url, lines = start_server(
        # random weights accept little, so the measured-cost gate would shut verify rounds off at
        # 2 live (engine.gate): the count alone here, as this tests the batched rounds' mechanics
        dict(cli_env, MLXCEL_GATE_COUNT_ONLY="1"),
        "-m",
        str(tiny_dir),
        "--draft-kind",
        "prompt-lookup",
        "--draft-tree-budget",
        "6",
        "-np",
        "2",
    )
    try:
        assert any("tree=6 nodes" in ln for ln in lines)
        texts = [
            " ".join(["abc def", "abc xy", "abc def gh", "abc"] * 3),
            " ".join(["one two", "one three", "one"] * 4),
        ]
        bodies = [{"prompt": t, "max_tokens": 32, "temperature": 0, "ignore_eos": True} for t in texts]
        with ThreadPoolExecutor(2) as pool:
            got = list(pool.map(lambda b: post(url + "/v1/completions", b), bodies))
        for (status, r), text in zip(got, texts):
            assert status == 200, r
            cli = mlxcel(cli_env, *generate_args(tiny_dir, text, 32))
            assert cli.stdout.rstrip("\n") == r["choices"][0]["text"].rstrip("\n")
        assert sum(r["timings"].get("draft_tree_rounds", 0) for _, r in got) > 0
        status, r = post(url + "/v1/completions", dict(bodies[0], temperature=0.9, seed=3))
        assert status == 200 and "draft_tree_rounds" not in r["timings"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@needs_kernel
def test_bench_compares_chains_and_trees(tiny_dir, cli_env, tmp_path):
    w = tmp_path / "w.jsonl"
    w.write_text(json.dumps({"kind": "edit", "prompt": " ".join(["abc def", "abc xy", "abc"] * 4)}) + "\n")
    out = tmp_path / "b.json"
    r = mlxcel(
        cli_env,
        *["bench", "-m", str(tiny_dir), "--prompt-lookup", "--draft-tree-budget", "0,4", "--no-chat-template"],
        *["--workload", str(w), "--max-tokens", "16", "--json", str(out)],
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["configs"] == ["plain", "prompt-lookup k=7", "prompt-lookup k=7 tree=4"]
    assert all(s["identical"] == s["prompts"] for s in data["summary"])


@needs_kernel
def test_api_load_with_a_tree_budget(tiny_dir):
    import mlxcel_py as mc

    m = mc.load(str(tiny_dir), draft_kind="suffix", draft_tree_budget=4)
    assert m.engine.tree_nodes == 4
    greedy = list(mc.speculative_generate(m, branchy_prompts(1)[0], mc.GenerateOptions(max_tokens=16)))
    sampled = mc.speculative_generate(
        m, branchy_prompts(1)[0], mc.GenerateOptions(max_tokens=16, temperature=0.8, seed=1)
    )
    assert len(greedy) == 16 and len(list(sampled)) == 16  # a sampled call verifies chains, not refused


def test_tree_budget_reaches_the_drafter_margin():
    src = registry.kind_of("prompt-lookup").source(
        DraftConfig(kind="prompt-lookup", tree_budget=2, tree_margin=0.5), model=None, eos_ids=(), vocab_size=10
    )
    assert src.make().tree_margin == 0.5
