"""llama.cpp's own server test suite, run against `mlxcel serve`.

    python scripts/llama_cpp_suite.py LLAMA_CPP_CHECKOUT [--python PY] [--json out.json] [-- PYTEST ARGS]

llama.cpp's tools/server/tests start `llama-server` from $LLAMA_SERVER_BIN_PATH with llama-server's
own flags, on small reference models they download. This script points that variable at itself:
called as the server (`--as-llama-server FLAGS...`), it drops what names or fetches a reference
model or an adapter made for one (`--hf-repo`, `--hf-file`, `--model-url`, `--model`, `--lora`: its
adapter is its MoE reference model's) and the flags of features
mlxcel-py does not have (each listed in DROPPED), then runs `mlxcel serve` with the rest, on the
default model (or $MLXCEL_SUITE_MODEL). Every other llama-server flag is passed on unchanged, so a
flag `mlxcel serve` lacks shows up as a failing test, not as a silent pass.

The suite's requirements (aiohttp, pytest, openai, requests, wget, prometheus-client...) are not
this project's: install them in the interpreter given by --python (default: this one). Without
network the suite's presets cannot download their models, which this stand-in never needs.

Prints pytest's summary and a table of failures by test file; --json writes every test's outcome.
Started with no model at all, llama-server is a router over its Hugging Face cache: the stand-in
then runs `mlxcel serve --models-dir EMPTY`, over a cache made here whose ggml-org repos (the
router tests' models) link to the stand-in model, and a hub on loopback (tests/fake_hub.py,
HF_ENDPOINT) serves the repo the download tests fetch and a preset repo (its preset.ini written
here, naming the cache's stand-ins) for the remote-preset test.
test_infill needs a model with FIM tokens, which the default model lacks (501, as llama-server answers).
Many tests compare against the reference models' exact text (stories260K's "Suddenly"...): those
fail on any other model and are counted, not fixed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

# llama-server flags whose feature mlxcel-py lacks or whose value names a reference model: dropped
# with their value (the number says how many values follow the flag).
DROPPED = {
    "--hf-repo": 1, "-hfr": 1, "--hf-file": 1, "-hff": 1, "--model-url": 1, "-mu": 1, "--model": 1,
    "--lora": 1, "--grp-attn-n": 1,
    "--grp-attn-w": 1, "--mmproj-url": 1,
}  # fmt: skip


# flags that name a model: without one llama-server is a router over the Hugging Face cache
MODEL_FLAGS = {"-m", "--model", "-hf", "-hfr", "--hf-repo", "--models-dir", "--models-preset", "-mu", "--model-url"}
# the router tests' models (ggml-org's, in the cache llama-server's router lists), standing in as
# the default model: a llama.cpp cache entry each, `OWNER/NAME:TAG` from the file name
ROUTER_MODELS = {
    "ggml-org/tinygemma3-GGUF": "tinygemma3-Q8_0.gguf",
    "ggml-org/test-model-stories260K": "stories260K-F32.gguf",
    "ggml-org/test-model-stories260K-infill": "stories260K-infill-F32.gguf",
}
# the draft models the suite downloads into its tmp folder (test_speculative's), standing in as the
# default model too: drafting with the target itself, its drafts are accepted and the output is its own
DRAFT_FILES = ("stories15M-q4_0.gguf",)
# what the router's download tests fetch (POST /models), served by a hub on loopback (HF_ENDPOINT)
HUB_MODELS = {"ggml-org/test-model-router-download": "test-model-router-download-F16.gguf"}
# a preset repo (`-hf REPO` with a preset.ini: llama-server's remote preset), on the same hub; its
# sections are the ones the remote-preset test asks for, over the stand-in cache's repos
HUB_PRESETS = {
    "ggml-org/test-preset-ci": "[tinygemma3-preset]\nhf-repo = ggml-org/tinygemma3-GGUF:Q8_0\n\n"
    "[stories260K-test]\nhf-repo = ggml-org/test-model-stories260K\n"
}


def server_argv(flags: list[str], mlxcel: str) -> list[str]:
    """`mlxcel serve` argv for llama-server's: reference-model and missing-feature flags dropped.
    With no model named, llama-server is a router over its cache: `mlxcel serve` becomes one with an
    empty --models-dir (its cache is listed beside it), since alone it serves the default model."""
    out, i = [mlxcel, "serve"], 0
    if not MODEL_FLAGS & set(flags):
        return out + ["--models-dir", os.environ["MLXCEL_SUITE_EMPTY_DIR"], *flags]
    for n, flag in enumerate(flags[:-1]):
        if flag in ("-hf", "-hfr", "--hf-repo") and flags[n + 1] in HUB_PRESETS:  # a preset repo: kept
            return out + flags
    model = os.environ.get("MLXCEL_SUITE_MODEL")
    if model:
        out += ["-m", model]
    while i < len(flags):
        flag = flags[i]
        if flag in DROPPED:
            i += 1 + DROPPED[flag]
            continue
        out.append(flag)
        i += 1
    return out


def run_suite(args: argparse.Namespace) -> int:
    tests = Path(args.checkout) / "tools" / "server" / "tests"
    if not (tests / "utils.py").is_file():
        print(f"{args.checkout}: no tools/server/tests/utils.py; name a llama.cpp checkout", file=sys.stderr)
        return 2
    mlxcel = shutil.which("mlxcel") or str(Path(sys.executable).with_name("mlxcel"))
    with tempfile.TemporaryDirectory() as tmp:
        stand_in = Path(tmp) / "llama-server"
        stand_in.write_text(
            f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" --as-llama-server "{mlxcel}" "$@"\n'
        )
        stand_in.chmod(0o755)
        report = Path(tmp) / "junit.xml"
        empty = Path(tmp) / "no-models"
        empty.mkdir()
        env = {
            **os.environ,
            "LLAMA_SERVER_BIN_PATH": str(stand_in),
            "LLAMA_CACHE": str(fake_cache(Path(tmp) / "cache")),
            "MLXCEL_SUITE_EMPTY_DIR": str(empty),
        }
        (tests / "tmp").mkdir(exist_ok=True)  # the suite's own scratch folder (its downloads made it)
        for name in DRAFT_FILES:
            link = tests / "tmp" / name
            if not link.exists():
                link.symlink_to(stand_in_model())
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from fake_hub import FakeHub

        repos = {repo: {name: stand_in_model()} for repo, name in HUB_MODELS.items()}
        for repo, text in HUB_PRESETS.items():
            ini = Path(tmp) / f"{repo.replace('/', '--')}.ini"
            ini.write_text(text)
            repos[repo] = {"preset.ini": ini}
        hub = FakeHub(repos)
        env["HF_ENDPOINT"] = hub.url
        cmd = [args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *args.pytest]
        rc = subprocess.call(cmd, cwd=tests, env=env)
        hub.close()
        outcomes = read_junit(report) if report.is_file() else {}
    by_file = Counter(name.split("::")[0] for name, outcome in outcomes.items() if outcome == "failed")
    totals = Counter(outcomes.values())
    print(f"\n{dict(totals)}", file=sys.stderr)
    for name, n in by_file.most_common():
        print(f"  {n:4d} failed  {name}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(outcomes, indent=1, sort_keys=True))
    return rc


def stand_in_model() -> Path:
    """$MLXCEL_SUITE_MODEL where it is a .gguf file, else the default model's GGUF."""
    model = os.environ.get("MLXCEL_SUITE_MODEL")
    if model is None or not model.endswith(".gguf"):
        from mlxcel_py.models.default_model import default_gguf

        model = str(default_gguf())
    return Path(model)


def fake_cache(root: Path) -> Path:
    """A Hugging Face cache (llama.cpp's layout) whose ROUTER_MODELS link to the stand-in model."""
    model = stand_in_model()
    commit = "0" * 40
    for repo, name in ROUTER_MODELS.items():
        folder = root / ("models--" + repo.replace("/", "--"))
        (folder / "refs").mkdir(parents=True)
        (folder / "refs" / "main").write_text(commit)
        (folder / "snapshots" / commit).mkdir(parents=True)
        (folder / "snapshots" / commit / name).symlink_to(Path(model).resolve())
    return root


def read_junit(path: Path) -> dict[str, str]:
    out = {}
    for case in ET.parse(path).iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        kinds = {child.tag for child in case}
        out[name] = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
    return out


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--as-llama-server":
        argv = server_argv(sys.argv[3:], sys.argv[2])
        os.execv(argv[0], argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkout", help="a llama.cpp checkout (its tools/server/tests are run)")
    p.add_argument("--python", default=sys.executable, help="the interpreter with the suite's requirements")
    p.add_argument("--json", help="write every test's outcome here")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:cut])
    args.pytest = argv[cut + 1 :]  # after --: pytest's own arguments (e.g. unit/test_basic.py -x)
    return run_suite(args)


if __name__ == "__main__":
    sys.exit(main())
