"""The lines scripts parse from stderr, in mlxcel's formats (a harness greps them from `2>&1`):
`[Generated ...]` (without --profile only), `[Profile Results]` and `[TTFT]`, `[Prompt lookup] ...`
with mlxcel's round counting, `[Speculative acceptance] ...` for every drafter kind, and the startup
lines. stdout stays the generated text alone."""

from __future__ import annotations

import re
import subprocess

import pytest
from conftest import mlxcel_cmd

NUM = r"(\d+(?:\.\d+)?)"
GENERATED = re.compile(rf"^\[Generated (\d+) tokens in {NUM}s = {NUM} tok/s\]$", re.M)
PROFILE = re.compile(
    rf"^\[Profile Results\]\n  Prompt tokens:    (\d+)\n  Generated tokens: (\d+)\n"
    rf"  Prefill:          {NUM} ms \({NUM} tok/s\)\n  Decode:           {NUM} ms \({NUM} tok/s\)\n"
    rf"\[TTFT\] {NUM} ms$",
    re.M,
)
LOOKUP = re.compile(
    r"^\[Prompt lookup\] rounds=(\d+) drafted_rounds=(\d+) paused_rounds=(\d+) proposed=(\d+) "
    r"accepted=(\d+) acceptance_rate=(\d\.\d{4}) tokens_per_forward=(\d+\.\d{4}) "
    r"shadow_confirmations=(\d+)$",
    re.M,
)
ACCEPTANCE = re.compile(
    r"^\[Speculative acceptance\] rule=(greedy-argmax|sampler-match|lossless-p/q) rounds=(\d+) "
    r"proposed=(\d+) positions_tested=(\d+) accepted=(\d+) per_position_acceptance=(\d\.\d{4}) "
    r"acceptance_rate=(\d\.\d{4}) mean_accepted_len=(\d+\.\d{4}) kind=([a-z-]+)$",
    re.M,
)


def gen(args, env):
    return subprocess.run(mlxcel_cmd() + ["generate", *args], capture_output=True, text=True, env=env, timeout=300)


def test_profile_lines_and_prompt_lookup_counts(tiny_dir, cli_env):
    r = gen(
        [
            "-m",
            str(tiny_dir),
            "-p",
            "abcabcabcabcabc",
            "-n",
            "30",
            "--ignore-eos",
            "--no-chat-template",
            "--prompt-lookup",
            "--profile",
        ],
        cli_env,
    )
    assert r.returncode == 0, r.stderr
    assert not GENERATED.search(r.stderr)  # mlxcel prints [Generated ...] only without --profile
    prof = PROFILE.search(r.stderr)
    assert prof and int(prof.group(2)) == 30
    lk = LOOKUP.search(r.stderr)
    rounds, drafted, paused, proposed, accepted = map(int, lk.groups()[:5])
    assert drafted <= rounds and accepted <= proposed
    assert float(lk.group(7)) == pytest.approx((30 - 1) / rounds, abs=1e-4)  # (generated - 1) / rounds
    acc = ACCEPTANCE.search(r.stderr)
    assert acc and acc.group(9) == "prompt-lookup"
    assert int(acc.group(2)) == drafted and int(acc.group(3)) == proposed and int(acc.group(5)) == accepted
    tested = int(acc.group(4))
    assert accepted <= tested <= proposed
    assert float(acc.group(6)) == pytest.approx(accepted / tested if tested else 0.0, abs=1e-4)
    assert "policy=graded" in r.stderr and "policy=auto" not in r.stderr  # the policy as it runs
    assert "Profile" not in r.stdout and "[" not in r.stdout


def test_summary_lines_without_profile_for_each_drafter(tiny_dir, tiny_draft_dir, cli_env):
    base = ["-m", str(tiny_dir), "-p", "hello hello hello", "-n", "20", "--ignore-eos", "--no-chat-template"]
    plain = gen(base, cli_env)
    m = GENERATED.search(plain.stderr)
    assert m and int(m.group(1)) == 20 and not ACCEPTANCE.search(plain.stderr)
    for extra, kind in [
        (["--draft-model", str(tiny_draft_dir), "--draft-block-size", "3", "-v"], "full-model"),
        (["--draft-kind", "suffix"], "suffix"),
    ]:
        r = gen(base + extra, cli_env)
        assert r.returncode == 0, r.stderr
        assert GENERATED.search(r.stderr)
        acc = ACCEPTANCE.search(r.stderr)
        assert acc and acc.group(9) == kind and not LOOKUP.search(r.stderr)
        assert r.stdout == plain.stdout
    assert (
        "Resolved drafter kind: full-model (block_size = 3, explicit)"
        in gen(base + ["--draft-model", str(tiny_draft_dir), "--draft-block-size", "3", "-v"], cli_env).stderr
    )
