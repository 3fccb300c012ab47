"""The Python API (`import mlxcel_py as mc`): the CLI's engine and validation, scriptable.

Greedy output through the API equals `mlxcel generate`'s and plain decoding's; a user's drafter,
right or wrong, changes only the counters; every built-in drafter runs through
speculative_generate; bad arguments raise the CLI's errors with the CLI's messages.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tiny_models
from conftest import ROOT, mlxcel_cmd
from test_families import copy_prompts

import mlxcel_py as mc

PROMPT = (ROOT / "examples" / "edit.txt").read_text()


@pytest.fixture(scope="module")
def default():
    return mc.load()


@pytest.fixture(scope="module")
def tiny_api(tiny_dir):
    return mc.load(str(tiny_dir))


def plain_ids(model, ids, n):
    gen = mc.speculative_generate(model, ids, mc.GenerateOptions(max_tokens=n, ignore_eos=True))
    return list(gen), gen


# ---- the CLI's output ---------------------------------------------------------------------------


def test_generate_equals_the_cli_greedy_with_and_without_prompt_lookup(default, cli_env):
    out = subprocess.run(
        [*mlxcel_cmd(), "generate", "--prompt-lookup", "-n", "48", "-p", PROMPT],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    cli = out.stdout.removesuffix("\n")  # the CLI ends its output with a newline
    assert mc.generate(default, PROMPT, max_tokens=48, prompt_lookup=True) == cli
    assert mc.generate(default, PROMPT, max_tokens=48) == cli  # plain decoding: the same text
    assert "".join(mc.stream(default, PROMPT, max_tokens=48, prompt_lookup=True)) == cli


def test_stop_strings_and_seeded_sampling_behave_as_on_the_cli(default):
    text = mc.generate(default, PROMPT, max_tokens=48)
    word = text.split()[3]
    cut = mc.generate(default, PROMPT, max_tokens=48, stop=[word])
    assert word not in cut and text.startswith(cut)
    a = mc.generate(default, PROMPT, max_tokens=24, temperature=0.9, seed=7, prompt_lookup=True)
    b = mc.generate(default, PROMPT, max_tokens=24, temperature=0.9, seed=7)
    assert a == b  # position-keyed draws: the speculative run repeats the plain run's samples


def test_stream_yields_pieces_that_are_their_text_and_carry_tokens_drafts_and_the_finish(default):
    text = mc.generate(default, PROMPT, max_tokens=32, prompt_lookup=True)
    pieces = list(mc.stream(default, PROMPT, max_tokens=32, prompt_lookup=True))
    assert all(isinstance(p, mc.StreamPiece) and isinstance(p, str) for p in pieces)
    assert "".join(pieces) == "".join(p.text for p in pieces) == text
    assert [p.finish_reason for p in pieces[:-1]] == [None] * (len(pieces) - 1)
    last = pieces[-1]
    assert last.finish_reason in ("stop", "length") and last.text == "" and last.tokens == ()
    ids = [t for p in pieces for t in p.tokens]
    assert default.decode(ids) == text and last.generated == len(ids)
    assert 0 < sum(p.from_draft for p in pieces) <= len(ids)  # the prompt is copied: drafts land
    assert all(0 <= p.from_draft <= len(p.tokens) for p in pieces) and last.tokens_per_second > 0
    # repeat_last_n reaches the sampler as on the CLI (a window of 0 turns the penalty off)
    plain = mc.generate(default, PROMPT, max_tokens=24)
    off = mc.generate(default, PROMPT, max_tokens=24, repetition_penalty=1.5, repeat_last_n=0)
    assert off == plain != mc.generate(default, PROMPT, max_tokens=24, repetition_penalty=1.5)
    with pytest.raises(mc.UsageError, match="repeat"):
        mc.generate(default, PROMPT, max_tokens=4, repeat_last_n=-7)


# ---- a user's drafter ---------------------------------------------------------------------------


class Oracle(mc.Drafter):
    """Proposes the plain run's own continuation: every draft is accepted."""

    kind = "oracle"

    def __init__(self, prompt_len, plain):
        self.prompt_len, self.plain, self.seen = prompt_len, plain, []

    def draft(self, context, k):
        done = len(context) - self.prompt_len
        return self.plain[done : done + k]

    def observe(self, accepted):
        self.seen.extend(accepted)


class Garbage(mc.Drafter):
    """Random ids, ids past the vocabulary, negative ids, floats and strings."""

    def __init__(self, seed=0):
        self.rng = random.Random(seed)

    def draft(self, context, k):
        pool = [self.rng.randrange(0, 260), 10**9, -3, 2.5, "x", self.rng.randrange(0, 260)]
        return [self.rng.choice(pool) for _ in range(k + 3)]  # more than asked, too


def test_a_users_drafter_right_or_wrong_leaves_the_output_plain(tiny_api):
    for ids in copy_prompts(4, seed=3):
        want, _ = plain_ids(tiny_api, ids, 32)
        oracle = Oracle(len(ids), want)
        got = mc.speculative_generate(
            tiny_api, ids, mc.GenerateOptions(max_tokens=32, ignore_eos=True), oracle, mc.DraftPolicy.fixed(4)
        )
        assert list(got) == want and got.finish_reason == "length"
        st = got.stats()
        assert st.draft_kind == "oracle" and st.verifies > 0 and st.accepted == st.drafted > 0
        assert st.steps < 32  # drafts were accepted: fewer target forwards than tokens
        assert oracle.seen == want[: len(oracle.seen)] and len(oracle.seen) >= 31  # observe() followed it
        bad = mc.speculative_generate(
            tiny_api, ids, mc.GenerateOptions(max_tokens=32, ignore_eos=True), Garbage(), mc.DraftPolicy.adaptive(6)
        )
        assert list(bad) == want
        st = bad.stats()
        assert st.draft_kind == "custom" and st.drafted > st.accepted  # drafted, mostly rejected


def test_a_drafter_without_draft_is_a_clear_error(tiny_api):
    class Empty(mc.Drafter):
        pass

    with pytest.raises(NotImplementedError, match="Empty implements neither draft"):
        list(mc.speculative_generate(tiny_api, [1, 2, 3, 1, 2], mc.GenerateOptions(max_tokens=4), Empty()))


# ---- every built-in drafter ---------------------------------------------------------------------


def test_prompt_lookup_and_suffix_drafters(tiny_api):
    store = mc.SuffixStore()
    accepted = {"prompt-lookup": 0, "suffix": 0}
    for ids in copy_prompts(4, seed=9):
        want, _ = plain_ids(tiny_api, ids, 32)
        opts = mc.GenerateOptions(max_tokens=32, ignore_eos=True)
        lookup = mc.speculative_generate(tiny_api, ids, opts, mc.PromptLookupDrafter(), mc.DraftPolicy.auto())
        assert list(lookup) == want and lookup.stats().draft_kind == "prompt-lookup"
        assert lookup.stats().policy == "graded"  # auto on the CPU, as the CLI's --prompt-lookup
        suffix = mc.speculative_generate(tiny_api, ids, opts, mc.SuffixDrafter(store), mc.DraftPolicy.cost(16))
        assert list(suffix) == want and suffix.stats().draft_kind == "suffix"
        store.add(ids + want)  # what the CLI's engine remembers after each request
        accepted["prompt-lookup"] += lookup.stats().accepted
        accepted["suffix"] += suffix.stats().accepted
    assert all(accepted.values()), accepted


def test_full_model_drafter(tiny_api, tiny_draft_dir):
    small = mc.load(str(tiny_draft_dir))
    for ids in copy_prompts(3, seed=4):
        want, _ = plain_ids(tiny_api, ids, 24)
        gen = mc.speculative_generate(
            tiny_api,
            ids,
            mc.GenerateOptions(max_tokens=24, ignore_eos=True),
            mc.FullModelDrafter(small.model, tiny_api.engine.vocab_size),
        )
        assert list(gen) == want
        st = gen.stats()
        assert st.draft_kind == "full-model" and st.policy == "fixed"
        # 4 a round (the model kind's default width), less in the last rounds before max_tokens
        assert 4 * (st.verifies - 3) <= st.drafted <= 4 * st.verifies
    self_drafted = mc.speculative_generate(
        tiny_api, ids, mc.GenerateOptions(max_tokens=24, ignore_eos=True), mc.FullModelDrafter(tiny_api.model)
    )
    assert list(self_drafted) == want and self_drafted.stats().accepted == self_drafted.stats().drafted


def test_prompt_lookup_beside_the_models_own_drafter_is_the_composite(tiny_dir, tiny_draft_dir, cli_env):
    """prompt_lookup=True on a model loaded with a draft model runs what `--draft-model D
    --prompt-lookup` runs (it raised a ValueError: the call built the model kind without its weights)."""
    from mlxcel_py.api import _lookup_drafting, _request

    m = mc.load(str(tiny_dir), draft=str(tiny_draft_dir))
    drafter, _ = _lookup_drafting(m, _request(m, mc.GenerateOptions(), prompt_lookup=True))
    assert drafter.kind == "prompt-lookup+full-model"
    text = "the cat sat on the mat. " * 6
    both = mc.generate(m, text, max_tokens=32, prompt_lookup=True, chat_template=False, ignore_eos=True)
    assert both == mc.generate(m, text, max_tokens=32, speculative=False, chat_template=False, ignore_eos=True)
    cli = subprocess.run(
        [*mlxcel_cmd(), "generate", "-m", str(tiny_dir), "--draft-model", str(tiny_draft_dir), "--prompt-lookup"]
        + ["--no-chat-template", "--ignore-eos", "-n", "32", "--temp", "0", "-p", text],
        capture_output=True,
        env=cli_env,
    )
    assert cli.returncode == 0 and cli.stdout.decode().removesuffix("\n") == both


def test_mtp_drafter_from_a_model_loaded_with_its_head(tmp_path):
    cfg = tiny_models.QWEN35
    folder = tiny_models.build(tmp_path / "qwen", cfg, scale=0.2, extra=tiny_models.mtp_tensors(cfg, kind="echo"))
    model = mc.load(str(folder), draft_kind="mtp")
    assert model.drafter_kind == "mtp"
    plain = mc.load(str(folder))
    for ids in copy_prompts(3, seed=2):
        want, _ = plain_ids(plain, ids, 24)
        drafter = model.make_drafter()
        assert isinstance(drafter, mc.MtpDrafter)
        gen = mc.speculative_generate(model, ids, mc.GenerateOptions(max_tokens=24, ignore_eos=True), drafter)
        assert list(gen) == want and gen.stats().draft_kind == "mtp" and gen.stats().verifies > 0
        own = mc.speculative_generate(model, ids, mc.GenerateOptions(max_tokens=24, ignore_eos=True))
        assert list(own) == want  # the model's own drafter when none is passed
    assert gen.stats().accepted > 0


# ---- refusals: the CLI's errors and messages ----------------------------------------------------


def cli_error(cli_env, *argv) -> str:
    out = subprocess.run([*mlxcel_cmd(), *argv], env=cli_env, capture_output=True, text=True, timeout=120)
    assert out.returncode in (1, 2), out
    return re.search(r"error: (.*)", out.stderr).group(1)


def test_bad_arguments_raise_the_clis_errors(tiny_api, tiny_dir, cli_env):
    cases = [
        (lambda: mc.load(draft_kind="eagle"), mc.UsageError, ("generate", "-p", "x", "--draft-kind", "eagle")),
        (
            lambda: mc.load(draft="d", draft_acceptance="pq"),
            mc.UsageError,
            ("generate", "-p", "x", "--draft-model", "d", "--draft-acceptance", "pq"),
        ),
        (lambda: mc.load("/nonexistent/model"), mc.ModelError, ("generate", "-p", "x", "-m", "/nonexistent/model")),
        (
            lambda: mc.load(str(tiny_dir), draft_kind="full-model"),
            mc.UsageError,
            ("generate", "-p", "x", "--draft-kind", "full-model"),
        ),
        (lambda: mc.generate(tiny_api, "hi", temperature=-1), mc.UsageError, ("generate", "-p", "x", "--temp", "-1")),
        (lambda: mc.generate(tiny_api, "hi", top_p=0), mc.UsageError, ("generate", "-p", "x", "--top-p", "0")),
        (lambda: mc.generate(tiny_api, "hi", max_tokens=-5), mc.UsageError, ("generate", "-p", "x", "-n", "-5")),
    ]
    for call, kind, argv in cases:
        with pytest.raises(kind) as info:
            call()
        assert isinstance(info.value, mc.MlxcelError)
        assert info.value.message == cli_error(cli_env, *argv), argv
    with pytest.raises(mc.UsageError, match="token ids must be integers"):
        mc.speculative_generate(tiny_api, [1, 10**9])
    with pytest.raises(mc.UsageError, match="token ids must be integers"):
        mc.speculative_generate(tiny_api, [True, 5])  # a bool is no token id
    for kwargs, message in [
        ({"temperature": float("nan")}, "temperature must be a number, got nan"),
        ({"temperature": "hot"}, "temperature must be a number, got 'hot'"),
        ({"max_tokens": 2.5}, "max_tokens must be an integer, got 2.5"),
        ({"stop": 5}, "stop must be a string or a list of strings, got 5"),
    ]:
        with pytest.raises(mc.UsageError) as info:
            mc.generate(tiny_api, "hi", **kwargs)
        assert info.value.message == message
    with pytest.raises(mc.UsageError, match="DraftPolicy max_draft must be between 1 and 64"):
        list(
            mc.speculative_generate(tiny_api, [1, 2], drafter=mc.PromptLookupDrafter(), policy=mc.DraftPolicy.fixed(0))
        )
    with pytest.raises(mc.UsageError, match="the prompt is empty"):
        mc.stream(tiny_api, "   ")  # checked when called, before any piece


def test_importing_the_package_loads_no_mlx():
    code = "import sys, mlxcel_py; mlxcel_py.__version__; assert 'mlx.core' not in sys.modules, 'mlx loaded'"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60).returncode == 0


# ---- docs/api.md: every example runs -----------------------------------------------------------


def test_the_api_page_examples_run(tmp_path):
    page = (ROOT / "docs" / "api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert len(blocks) >= 3
    script = tmp_path / "examples.py"
    script.write_text("\n\n".join(blocks))
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    self_drafted = re.search(r"full-model drafter: accepted (\d+) of (\d+)", out.stdout)
    assert (
        self_drafted and int(self_drafted.group(1)) == int(self_drafted.group(2)) > 0
    )  # the target drafting for itself
    assert re.search(r"steps \d+, verifies [1-9]\d*, drafted \d+, accepted \d+", out.stdout)


def test_the_package_is_typed():
    assert (Path(mc.__file__).parent / "py.typed").exists()


def test_every_exported_name_is_the_objects_own_and_known_to_type_checkers():
    """The lazy export table and the TYPE_CHECKING imports list the same names, and each name is
    what its object is called (mc.MtpDrafter was the class MTPDrafter; two drafters were missing
    from the type checkers' list)."""
    import ast
    import inspect

    tree = ast.parse(Path(mc.__file__).read_text())
    checked = {
        (alias.asname or alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
        for sub in node.body
        if isinstance(sub, ast.ImportFrom)
        for alias in sub.names
    }
    assert checked == set(mc._API), checked ^ set(mc._API)
    for name in mc._API:
        obj = getattr(mc, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__name__ == name, (name, obj.__name__)
