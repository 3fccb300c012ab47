import random

import pytest

from mlxcel_py.drafters.prompt_lookup import PromptLookupIndex, find_by_scan


def index_of(tokens, lo=2, hi=3):
    ix = PromptLookupIndex(lo, hi)
    ix.reset(tokens)
    return ix


def test_proposes_followers_of_latest_match():
    #          0  1  2  3  4  5  6  7  8
    tokens = [1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 1, 2, 3]
    # suffix (1,2,3) occurs at 0 and 5; the latest earlier one (5) is followed by 5, 7, 1, ...
    assert index_of(tokens).find(3) == [5, 7, 1]


def test_capped_by_limit_and_context_end():
    tokens = [1, 2, 3, 4, 1, 2]
    assert index_of(tokens).find(1) == [3]
    assert index_of(tokens).find(10) == [3, 4, 1, 2]


def test_longest_suffix_wins_and_falls_back_to_shorter():
    tokens = [7, 2, 3, 8, 1, 2, 3, 9, 5, 2, 3]
    # 3-gram (5,2,3) never occurred before; 2-gram (2,3) latest earlier at 5 -> follower 9
    assert index_of(tokens).find(2) == [9, 5]
    tokens = [1, 2, 3, 4, 7, 2, 3, 5, 1, 2, 3]
    # 3-gram (1,2,3) at 0 beats the later 2-gram (2,3) at 5
    assert index_of(tokens).find(1) == [4]


def test_never_matches_itself_and_short_contexts():
    assert index_of([1, 2, 3]).find(4) == []
    assert index_of([]).find(4) == []
    assert index_of([5]).find(4) == []
    assert index_of([1, 2, 3, 4]).find(0) == []


def test_default_min_two_skips_unigrams():
    tokens = [1, 5, 2, 1]
    assert index_of(tokens).find(3) == []
    assert index_of(tokens, lo=1, hi=3).find(3) == [5, 2, 1]


def test_repeated_run():
    tokens = [4, 4, 4, 4, 4]
    assert index_of(tokens).find(3) == [4]  # latest earlier (4,4,4) starts at 1, one follower


@pytest.mark.parametrize("seed", range(30))
def test_index_equals_scan_also_when_extended_in_blocks(seed):
    rng = random.Random(seed)
    lo = rng.randint(1, 3)
    hi = rng.randint(lo, 5)
    tokens = [rng.randint(0, 5) for _ in range(rng.randint(0, 60))]
    ix = PromptLookupIndex(lo, hi)
    ix.reset(tokens[:10])
    pos = 10
    while pos <= len(tokens):
        for limit in (1, 3, 7):
            assert ix.find(limit) == find_by_scan(tokens[:pos], lo, hi, limit)
        step = rng.randint(1, 4)
        ix.extend(tokens[pos : pos + step])
        pos += step


def test_match_length_reaches_back_past_the_ngram():
    #         long shared context ........  short one
    tokens = [9, 8, 7, 1, 2, 3, 4, 5, 0, 6, 1, 2, 3, 4, 9, 8, 7, 1, 2, 3]
    # the 3-gram (1,2,3) latest earlier at 10 (preceded by 6): the match is just 3 long
    assert index_of(tokens).find_match(2) == ([4, 9], 3)
    tokens = [6, 7, 8, 9, 1, 2, 3, 4, 0, 6, 7, 8, 9, 1, 2, 3]
    # the latest earlier (1,2,3) is preceded by 6,7,8,9 in both places: 7 tokens agree
    assert index_of(tokens).find_match(1) == ([4], 7)


def test_periodic_proposals_continue_a_loop_past_the_context_end():
    tokens = [5, 1, 2, 3, 1, 2, 3, 1, 2]  # a loop of period 3
    ix = index_of(tokens)
    assert ix.find_match(7)[0] == [3, 1, 2]  # mlxcel's drafter: stops at the context's end
    assert ix.find_match(7, periodic=True)[0] == [3, 1, 2, 3, 1, 2, 3]
    assert index_of([4, 4, 4, 4, 4]).find_match(3, periodic=True)[0] == [4, 4, 4]


def test_drafter_stops_a_proposal_at_eos_unless_eos_is_ignored():
    from types import SimpleNamespace

    from mlxcel_py.drafters.prompt_lookup import PromptLookupDrafter

    ctx = [1, 2, 3, 0, 7, 7, 1, 2]  # 0 is EOS
    d = PromptLookupDrafter(2, 3, eos_ids=[0])
    d.begin(ctx)
    assert d.propose(ctx, 5, SimpleNamespace(ignore_eos=False)).tokens == [3, 0]
    assert d.propose(ctx, 5, SimpleNamespace(ignore_eos=True)).tokens == [3, 0, 7, 7, 1]


def test_short_fallback_proposes_the_newest_tokens_followers_when_no_ngram_matches():
    tokens = [1, 5, 2, 6, 9, 1]  # no 2-gram (9, 1) before; the token 1 alone was followed by 5, 2, ...
    ix = PromptLookupIndex(2, 3, fallback=2)
    ix.reset(tokens)
    assert ix.find_match(7) == ([5, 2], 1)  # at most `fallback` tokens, match length 1
    assert ix.find_match(1) == ([5], 1)  # and never more than asked
    assert ix.find_match(7, fallback=False) == ([], 0)
    assert index_of(tokens).find(7) == []  # fallback 0: mlxcel's drafter
    ix.extend([5])  # now (1, 5) matches as a 2-gram: the full continuation again
    assert ix.find_match(7) == ([2, 6, 9, 1, 5], 2)
    assert PromptLookupIndex(1, 3, fallback=2).fallback == 0  # with ngram_min 1 a 1-gram is a match


@pytest.mark.parametrize("seed", range(20))
def test_fallback_equals_a_rescan_of_ngrams_then_the_last_token(seed):
    rng = random.Random(100 + seed)
    lo, hi = 2, rng.randint(2, 4)
    fallback = rng.randint(1, 3)
    tokens = [rng.randint(0, 6) for _ in range(rng.randint(0, 50))]
    ix = PromptLookupIndex(lo, hi, fallback)
    ix.reset(tokens[: len(tokens) // 2])
    ix.extend(tokens[len(tokens) // 2 :])
    for limit in (1, 3, 8):
        want = find_by_scan(tokens, lo, hi, limit) or find_by_scan(tokens, 1, 1, min(limit, fallback))
        assert ix.find(limit) == want


def test_fallback_length_comes_from_the_environment_and_is_checked(monkeypatch):
    from mlxcel_py.drafters import prompt_lookup
    from mlxcel_py.errors import UsageError

    assert prompt_lookup.fallback_length() == prompt_lookup.FALLBACK == 2
    monkeypatch.setenv("MLXCEL_LOOKUP_FALLBACK", "0")
    assert prompt_lookup.fallback_length() == 0
    for bad in ("-1", "1.5", "two", "²"):
        monkeypatch.setenv("MLXCEL_LOOKUP_FALLBACK", bad)
        with pytest.raises(UsageError, match="MLXCEL_LOOKUP_FALLBACK"):
            prompt_lookup.fallback_length()


def test_shadow_proposals_never_use_the_fallback():
    from mlxcel_py.drafters.prompt_lookup import PromptLookupDrafter

    d = PromptLookupDrafter()
    d.begin([1, 5, 2, 6, 9, 1])
    assert d.index.find(4) == [5, 2]
    assert d.shadow(4) == []  # the gated policy resumes on real n-gram evidence only


def test_a_fallback_chain_branches_over_the_newest_tokens_other_occurrences():
    from mlxcel_py.engine.tree import DraftTree

    tokens = [1, 5, 2, 8, 1, 6, 3, 9, 1]  # no 2-gram (9, 1) before; token 1 was followed by 5 2 and 6 3
    ix = PromptLookupIndex(2, 3, fallback=2)
    ix.reset(tokens)
    chain, length, tree = ix.find_tree(7)
    assert (chain, length) == ([6, 3], 1)
    assert isinstance(tree, DraftTree)
    paths = {tuple(tree.tokens[j] for j in tree.path(i)) for i in range(len(tree.tokens))}
    assert {(6, 3), (5, 2)} <= paths and max(map(len, paths)) == 2  # both continuations, as short as the fallback
