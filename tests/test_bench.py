"""`mlxcel bench` end to end on tiny models: JSON fields that agree with the raw runs, a real PNG,
the markdown table on stdout, the mlx-lm peer side by side; and the pure summary/width logic."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import mlxcel_cmd

from mlxcel_py.bench import report
from mlxcel_py.bench.runner import BenchResult, RunRecord

SUMMARY_FIELDS = {
    "config",
    "width",
    "kind",
    "prompts",
    "plain_tps",
    "spec_tps",
    "speedup",
    "mean_accepted_prefix",
    "tokens_per_verify",
    "acceptance_rate",
    "draft_ms_per_round",
    "verify_ms_per_round",
    "plain_ms_per_token",
    "plain_peak_mib",
    "spec_peak_mib",
    "identical",
    "peer_tps",
    "vs_peer",
    "weights",
    "plain_vs_first",
}


@pytest.fixture
def tiny_workload(tmp_path):
    w = tmp_path / "w.jsonl"
    rows = [
        {"kind": "copy", "prompt": "Repeat: one two three four five six. one two three four five six.", "source": "a"},
        {"kind": "copy", "prompt": "Say abc abc abc abc abc abc abc", "source": "b"},
        {"kind": "free", "prompt": "Hello there", "source": "c"},
    ]
    w.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return w


def _bench(args, env, timeout=600):
    return subprocess.run(mlxcel_cmd() + ["bench", *args], capture_output=True, text=True, env=env, timeout=timeout)


def test_bench_sweep_writes_json_png_and_markdown(tiny_dir, tiny_workload, cli_env, tmp_path):
    from mlxcel_py.cpu import blas

    out_json, out_png = tmp_path / "b.json", tmp_path / "sweep.png"
    r = _bench(
        [
            "-m",
            str(tiny_dir),
            "--workload",
            str(tiny_workload),
            "--max-tokens",
            "12",
            "--sweep-widths",
            "3,1",
            "--repeats",
            "2",
            "--json",
            str(out_json),
            "--plot",
            str(out_png),
            "--markdown",
        ],
        cli_env,
    )
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    data = json.loads(out_json.read_text())
    assert data["blas"] == blas.state().name  # the fast path was set up before mlx.core loaded
    assert data["configs"] == ["plain", "prompt-lookup k=1", "prompt-lookup k=3"]
    assert data["widths"] == [1, 3] and data["max_tokens"] == 12 and data["workload"] == str(tiny_workload)
    runs = data["runs"]
    assert data["repeats"] == 2 and "3 prompts x 6 runs" in r.stderr
    assert len(runs) == 3 * 3  # 3 prompts x (plain + 2 widths): the median-speed repeat of each
    assert [r["config"] for r in runs[:3]] == data["configs"]  # interleaved: each prompt under every config in turn
    summary = data["summary"]
    assert {(s["config"], s["kind"]) for s in summary} == {
        (c, k) for c in data["configs"][1:] for k in ("copy", "free", "all")
    }
    for s in summary:
        assert set(s) == SUMMARY_FIELDS
        mine = [x for x in runs if x["config"] == s["config"] and s["kind"] in ("all", x["kind"])]
        assert s["prompts"] == len(mine)
        assert s["identical"] == len(mine)  # greedy: every speculative output equals plain
        drafted = sum(x["drafted_rounds"] for x in mine)
        accepted = sum(x["accepted"] for x in mine)
        if drafted:
            assert s["mean_accepted_prefix"] == pytest.approx(accepted / drafted)
            assert s["tokens_per_verify"] == pytest.approx(s["mean_accepted_prefix"] + 1)
        assert s["acceptance_rate"] <= 1.0 and s["speedup"] > 0 and s["plain_tps"] > 0
    assert all(x["proposed"] <= 1 * x["drafted_rounds"] for x in runs if x["config"] == "prompt-lookup k=1")
    rec = data["recommended_widths"]
    assert [c["drafter"] for c in rec] == ["prompt-lookup"] and rec[0]["width"] in (1, 3)
    assert f"--prompt-lookup-max-draft {rec[0]['width']}" in r.stderr
    # the plot is a real PNG that matplotlib reads back
    assert data["plot"] == str(out_png) and f"plot: {out_png}" in r.stderr
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    img = matplotlib.image.imread(str(out_png))
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 400
    # stdout: only the markdown table, one row per summary row
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("| drafter | kind | prompts | plain tok/s |")
    assert len(lines) == 2 + len(summary)


def test_bench_draft_model_and_lookup_side_by_side_with_mlx_lm(
    tiny_dir, tiny_draft_dir, tiny_workload, cli_env, tmp_path
):
    out_json = tmp_path / "b.json"
    r = _bench(
        [
            "-m",
            str(tiny_dir),
            "--draft-model",
            str(tiny_draft_dir),
            "--prompt-lookup",
            "--draft-block-size",
            "2",
            "--workload",
            str(tiny_workload),
            "--limit",
            "1",
            "--max-tokens",
            "10",
            "--vs",
            "mlx-lm",
            "--json",
            str(out_json),
        ],
        cli_env,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(out_json.read_text())
    assert data["configs"] == [
        "plain",
        "full-model k=2",
        "prompt-lookup k=7",
        "prompt-lookup+full-model k=7/2",  # both flags: the composite too (drafters/composite.py)
        "mlx-lm plain",
        "mlx-lm draft k=2",
    ]
    assert len(data["runs"]) == 2 * 6  # --limit 1: one prompt per kind
    for s in data["summary"]:
        assert s["identical"] == s["prompts"]
        assert s["peer_tps"] > 0 and s["vs_peer"] > 0
    peer_runs = [x for x in data["runs"] if x["config"].startswith("mlx-lm")]
    assert all(x["tokens"] > 0 and x["decode_tps"] > 0 for x in peer_runs)
    assert "mlx-lm tok/s" in r.stderr
    assert data["plain_vs_peer"] > 0 and "plain decode vs mlx-lm plain decode" in r.stderr


def test_bench_compares_cpu_weight_modes_in_one_run(tiny_dir, tiny_workload, cli_env, tmp_path):
    """--cpu-weights f32,q8,q4: the model in each form, plain and prompt lookup, interleaved; each
    mode's speculative output equals its own plain output, and plain speed is set against f32's."""
    from mlxcel_py.cpu import extension as cpu_extension

    out_json = tmp_path / "w.json"
    r = _bench(
        [
            "-m",
            str(tiny_dir),
            "--workload",
            str(tiny_workload),
            "--max-tokens",
            "10",
            "--cpu-weights",
            "f32,q8,q4",
            "--json",
            str(out_json),
            "--markdown",
        ],
        cli_env,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(out_json.read_text())
    assert data["cpu_weights"] == ["f32", "q8", "q4"] and "3 prompts x 6 runs" in r.stderr
    modes = data["cpu_weights_modes"]
    assert modes["f32"]["mode"] == "f32"
    built = cpu_extension.kernel_status()[0] is not None
    assert modes["q8"]["bits"] == ([8] if built else []) and modes["q4"]["bits"] == ([4] if built else [])
    runs = data["runs"]
    assert {(x["weights"], x["config"]) for x in runs} == {
        (m, c) for m in ("f32", "q8", "q4") for c in ("plain", "prompt-lookup k=7")
    }
    overall = {s["weights"]: s for s in data["summary"] if s["kind"] == "all"}
    assert set(overall) == {"f32", "q8", "q4"}
    for mode, s in overall.items():
        assert s["identical"] == s["prompts"] == 3, mode
    assert overall["f32"]["plain_vs_first"] == 1.0 and overall["q8"]["plain_vs_first"] > 0
    table = r.stdout.splitlines()
    assert table[0].startswith("| weights | drafter |") and table[0].rstrip().endswith("| plain vs f32 |")


def test_bench_refuses_a_mode_list_outside_bench(tiny_dir, cli_env):
    r = subprocess.run(
        mlxcel_cmd() + ["generate", "-m", str(tiny_dir), "-p", "x", "--cpu-weights", "q8,q4"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=120,
    )
    assert r.returncode == 2 and "a comma list is a bench option" in r.stderr


def _rec(i, kind, config, tps, width=None, **kw):
    return RunRecord(
        prompt_index=i,
        kind=kind,
        source="",
        config=config,
        width=width,
        tokens=10,
        decode_tps=tps,
        decode_s=10 / tps,
        **kw,
    )


def test_summary_takes_medians_of_per_prompt_ratios_and_pools_counters():
    res = BenchResult(configs=["plain", "prompt-lookup k=4"])
    for i, (kind, plain, spec) in enumerate([("a", 10, 30), ("a", 20, 20), ("b", 10, 15)]):
        res.records.append(_rec(i, kind, "plain", plain))
        res.records.append(
            _rec(
                i,
                kind,
                "prompt-lookup k=4",
                spec,
                width=4,
                drafted_rounds=2,
                accepted=3,
                proposed=8,
                identical=True,
                speedup=spec / plain,
            )
        )
    rows = {(r.kind): r for r in report.summarize(res)}
    assert rows["a"].speedup == pytest.approx(2.0)  # median of 3.0 and 1.0
    assert rows["all"].speedup == pytest.approx(1.5)  # median of 3.0, 1.0, 1.5
    assert rows["all"].mean_accepted_prefix == pytest.approx(9 / 6)
    assert rows["all"].acceptance_rate == pytest.approx(9 / 24)
    assert rows["all"].identical == 3 and rows["b"].prompts == 1


def test_recommended_width_is_the_narrowest_within_two_percent_of_the_best():
    def row(w, speedup):
        return report.SummaryRow(
            config=f"prompt-lookup k={w}",
            width=w,
            kind="all",
            prompts=1,
            plain_tps=1,
            spec_tps=speedup,
            speedup=speedup,
            mean_accepted_prefix=0,
            tokens_per_verify=0,
            acceptance_rate=0,
            draft_ms_per_round=0,
            verify_ms_per_round=0,
            plain_ms_per_token=0,
            plain_peak_mib=0,
            spec_peak_mib=0,
            identical=1,
        )

    (c,) = report.recommend_widths([row(2, 1.5), row(4, 2.45), row(7, 2.5), row(12, 2.3)])
    assert (c.width, c.flag) == (4, "--prompt-lookup-max-draft")
    (c,) = report.recommend_widths([row(2, 1.5), row(4, 2.0), row(7, 2.5)])
    assert c.width == 7


def test_bench_side_by_side_with_llama_cpp_on_the_same_gguf(tiny_workload, cli_env, tmp_path):
    """The llama.cpp peer's plumbing, with a stand-in llama_cpp package (tests/fake_llama_cpp)."""
    import os

    import gguf_files
    from gguf_files import Q

    model = tmp_path / "tiny.gguf"
    gguf_files.write(model, "llama", [Q.F32])
    log = tmp_path / "llama.log"
    fake = str(os.path.join(os.path.dirname(__file__), "fake_llama_cpp"))
    env = {**cli_env, "PYTHONPATH": os.pathsep.join([fake, cli_env.get("PYTHONPATH", "")]), "FAKE_LLAMA_LOG": str(log)}
    out_json = tmp_path / "b.json"
    r = _bench(
        [
            "-m",
            str(model),
            "--prompt-lookup",
            "--workload",
            str(tiny_workload),
            "--limit",
            "1",
            "--max-tokens",
            "10",
            "--vs",
            "llama.cpp",
            "--json",
            str(out_json),
            "--markdown",
        ],
        env,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(out_json.read_text())
    assert data["configs"] == ["plain", "prompt-lookup k=7", "llama.cpp plain", "llama.cpp lookup k=7"]
    peer_runs = [x for x in data["runs"] if x["config"].startswith("llama.cpp")]
    assert len(peer_runs) == 2 * 2 and all(x["tokens"] == 10 and x["decode_tps"] > 0 for x in peer_runs)
    lookup = {x["kind"]: x["decode_tps"] for x in peer_runs if x["config"] == "llama.cpp lookup k=7"}
    for s in data["summary"]:  # prompt lookup is compared with llama.cpp's lookup at the same width
        if s["kind"] != "all":
            assert s["peer_tps"] == pytest.approx(lookup[s["kind"]])
        assert s["vs_peer"] > 0
    asked = [json.loads(line) for line in log.read_text().splitlines()]
    assert {a["width"] for a in asked} == {None, 7} and all(a["temp"] == 0.0 for a in asked)
    assert all(a["logits_all"] == (a["width"] is not None) for a in asked)  # drafts need every position's logits
    assert "| llama.cpp tok/s | vs llama.cpp |" in r.stdout
    assert data["plain_vs_peer"] > 0 and "plain decode vs llama.cpp plain decode" in r.stderr
    assert all(x["prefill_s"] > 0 for x in peer_runs)  # the peer's time to its first token
    assert data["prefill_vs_peer"] > 0 and "prefill: " in r.stderr


def test_bench_busy_says_so_records_it_and_refuses_too_many(tiny_dir, tiny_workload, cli_env, tmp_path):
    out_json = tmp_path / "b.json"
    args = ["-m", str(tiny_dir), "--workload", str(tiny_workload), "--limit", "1", "--max-tokens", "8"]
    r = _bench([*args, "--busy", "2", "--json", str(out_json)], cli_env)
    assert r.returncode == 0, r.stderr
    assert "2 busy loop(s) at nice 19 beside it" in r.stderr
    assert json.loads(out_json.read_text())["busy"] == 2
    bad = _bench([*args, "--busy", "65"], cli_env)
    assert bad.returncode == 2 and "--busy must be between 0 and 64" in bad.stderr


def test_busy_loops_spin_at_nice_19_and_none_outlives_the_block():
    import os
    import time

    from mlxcel_py.bench.busy import busy_loops

    def stat(pid):  # (utime + stime ticks, nice) from /proc/PID/stat
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12]), int(fields[16])

    with busy_loops(2) as pids:
        assert len(pids) == 2
        time.sleep(0.2)
        first = [stat(p) for p in pids]
        assert all(n == 19 for _, n in first)
        deadline = time.monotonic() + 20  # nice 19 beside other work: CPU time comes slowly
        while time.monotonic() < deadline and not all(stat(p)[0] > a[0] for p, a in zip(pids, first)):
            time.sleep(0.2)
        assert all(stat(p)[0] > a[0] for p, a in zip(pids, first))  # they spin
    assert not any(os.path.exists(f"/proc/{p}") for p in pids)
