"""--context-shift outside serve (llama-cli's): `generate` with `-c N` goes past a full window by
dropping part of the context, where it used to stop; speculative output still equals plain output
across the shifts; `-c` and `--keep` out of range are refused on every command before loading."""

from __future__ import annotations

import pytest
from test_cli_generate import mlxcel
from test_validate import no_loading  # noqa: F401  (the fixture: no model may load)
from typer.testing import CliRunner

from mlxcel_py.cli import app

PROMPT = "abc abc abc abc abc"


def generate(env, model, *extra) -> str:
    out = mlxcel(
        ["generate", "-m", str(model), "-p", PROMPT, "--no-chat-template", "--ignore-eos", "-c", "40", *extra], env
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_generate_goes_past_a_full_window_and_speculation_stays_exact(tiny_dir, cli_env):
    stopped = generate(cli_env, tiny_dir, "-n", "90")  # prompt + reply fill the 40-token window
    shifted = generate(cli_env, tiny_dir, "-n", "90", "--context-shift")
    assert shifted.startswith(stopped.rstrip("\n")) and len(shifted) > len(stopped)
    # the same tokens with prompt lookup, and with --keep (a longer kept head) against its plain run
    assert generate(cli_env, tiny_dir, "-n", "90", "--context-shift", "--prompt-lookup") == shifted
    kept = generate(cli_env, tiny_dir, "-n", "90", "--context-shift", "--keep", "-1")
    assert generate(cli_env, tiny_dir, "-n", "90", "--context-shift", "--keep", "-1", "--prompt-lookup") == kept


@pytest.mark.parametrize(
    "argv,message",
    [
        (["generate", "-p", "x", "-c", "-1"], "--ctx-size must be 0 (the model's window) or a positive number"),
        (["chat", "--keep", "-2"], "--keep must be -1 (the whole prompt) or 0 or more tokens"),
    ],
)
@pytest.mark.usefixtures("no_loading")
def test_window_flags_out_of_range_are_refused_on_every_command(argv, message, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2 and message in result.stderr


def test_chat_shifts_a_reply_that_fills_the_window(tiny_dir, cli_env):
    def chat(*extra) -> str:
        args = ["chat", "-m", str(tiny_dir), "-c", "60", "-n", "80", "--ignore-eos", *extra]
        out = mlxcel(args, cli_env, input="hello there\n")
        assert out.returncode == 0, out.stderr
        return out.stdout

    stopped, shifted = chat(), chat("--context-shift")
    assert shifted.startswith(stopped.rstrip("\n")) and len(shifted) > len(stopped)


def test_a_long_chat_drops_its_oldest_exchanges_instead_of_empty_replies(tiny_dir, cli_env):
    """`chat -c 160`: once the history passes the window, the oldest exchange goes (said on stderr)
    and every message is still answered; they used to get empty replies. A message that alone
    fills the window is refused in one line and the chat goes on."""
    lines = [f"message {i}: tell me about rivers, mountains, castles and the sea, please" for i in range(5)]
    lines.insert(3, "x" * 400)  # over the window on its own (a byte tokenizer: 400 tokens)
    out = mlxcel(
        ["chat", "-m", str(tiny_dir), "-n", "40", "-c", "160", "--ignore-eos", "--profile"],
        cli_env,
        input="\n".join(lines) + "\n",
    )
    assert out.returncode == 0, out.stderr
    turns = [ln for ln in out.stderr.splitlines() if "prompt tokens reused" in ln]
    assert len(turns) == 5 and all(t.startswith("[40 tokens") for t in turns), turns
    assert "oldest messages no longer fit the context window of 160 tokens" in out.stderr
    assert "fills the context window (160); shorten it (the conversation is kept)" in out.stderr
