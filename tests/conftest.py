"""Shared fixtures: tiny random mlx-lm models written to temp dirs, and the real default model.

The BLAS swap must happen before anything imports mlx.core, so it is the first thing here.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from mlxcel_py.cpu import blas

blas.prepare()

import mlx.core as mx  # noqa: E402
import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_byte_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "chat_template": CHATML,
                "clean_up_tokenization_spaces": False,
            }
        )
    )


def make_tiny_model(
    folder: Path, *, seed: int = 0, hidden: int = 64, layers: int = 2, vocab: int = 260, scale: float = 1.0
) -> Path:
    """A random llama that mlx_lm.load reads offline. `scale` > 1 makes its logits less flat,
    so greedy decoding wanders instead of collapsing to one repeated token."""
    from mlx.utils import tree_map
    from mlx_lm.models import llama
    from mlx_lm.utils import save_config, save_model

    folder.mkdir(parents=True, exist_ok=True)
    cfg = dict(
        model_type="llama",
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=hidden * 2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=vocab,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
    )
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs(**cfg))
    if scale != 1.0:
        model.update(tree_map(lambda p: p * scale if p.ndim == 2 else p, model.parameters()))
    mx.eval(model.parameters())
    save_model(folder, model)
    save_config(dict(cfg), folder / "config.json")
    write_byte_tokenizer(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=1, scale=2.5)


@pytest.fixture(scope="session")
def tiny_draft_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tinydraft") / "model", seed=2, hidden=32, layers=1, scale=4.0)


@pytest.fixture(scope="session")
def tiny(tiny_dir):
    from mlxcel_py.models import loading

    return loading.load(loading.resolve(str(tiny_dir)))


@pytest.fixture(scope="session")
def real():
    """The real default model (SmolLM2-135M-Instruct), loaded once, float32 on the CPU."""
    from mlxcel_py.models import loading

    return loading.load(loading.resolve(None))


@pytest.fixture(scope="session")
def workloads() -> list[dict]:
    path = SHARED / "workloads" / "public.jsonl"
    if not path.exists():  # a clone without ../shared beside it: the copy kept in the repo
        path = ROOT / "benchmarks" / "workloads.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def verify_round(cache, history, draft, decider, q=None):
    """One verify round as the round loop runs it alone: mark, feed `[last, *draft]`, judge."""
    from mlxcel_py.engine.verify import judge

    cache.mark()
    return judge(cache, history, draft, decider, q, cache.feed([history[-1], *draft]))


def mlxcel_cmd() -> list[str]:
    return [sys.executable, "-m", "mlxcel_py"]


@pytest.fixture
def cli_env(tmp_path) -> dict:
    env = dict(os.environ)
    env["HF_HUB_OFFLINE"] = "1"
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg-config")  # no user config file leaks in
    env.pop("MLXCEL_CONFIG", None)
    return env


@pytest.fixture
def no_weights(monkeypatch):
    """Startup refusals must come before any weight loads: loading raises if it is reached."""
    from mlxcel_py.models import loading

    def forbidden(*a, **k):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(loading, "load", forbidden)


def _cpu_weights_line() -> str:
    from mlxcel_py.cpu import extension as cpu_extension

    qmm, why = cpu_extension.kernel_status()
    if qmm is not None:
        return f"mlxcel-py CPU weights: {why} built and in use (--cpu-weights auto); kernel tests ran"
    return f"mlxcel-py CPU weights: float32 ({why}); kernel tests were skipped"


def pytest_report_header(config):
    """Which CPU weight path this machine runs (`make test` exercises whichever built)."""
    return _cpu_weights_line()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    # again at the end: `make test` runs pytest -q, which hides the header
    terminalreporter.write_line(_cpu_weights_line())


def wait_until(check, limit: float = 30.0, every: float = 0.02) -> bool:
    """Poll `check` until it holds or `limit` seconds pass; its last answer."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(every)
    return check()
