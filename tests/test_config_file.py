"""Config file defaults: applied, overridden by flags, unknown keys and wrong types refused."""

from __future__ import annotations

from typer.testing import CliRunner

from mlxcel_py.cli import app
from mlxcel_py.commands import _oneshot


def invoke(argv, tmp_path, monkeypatch, text=None):
    seen = {}

    def fake(run, world=None):
        seen["run"] = run

    monkeypatch.setattr(_oneshot, "run_oneshot", fake)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    if text is not None:
        cfg = tmp_path / "c.toml"
        cfg.write_text(text)
        argv = ["--config", str(cfg)] + argv
    return CliRunner().invoke(app, argv), seen


def test_values_apply_and_flags_win(tmp_path, monkeypatch):
    text = (
        'max-tokens = 33\ntemp = 0.5\n[generate]\nprompt-lookup = true\nprompt_lookup_policy = "cost"\nstop = ["END"]\n'
    )
    r, seen = invoke(["generate", "-p", "x"], tmp_path, monkeypatch, text)
    assert r.exit_code == 0, r.output
    run = seen["run"]
    assert run.options.generation.max_tokens == 33 and run.options.sampling.temp == 0.5
    assert run.draft.kind == "prompt-lookup" and run.draft.lookup.policy == "cost"
    assert run.options.generation.stop == ("END",)
    r, seen = invoke(["generate", "-p", "x", "-n", "5", "--prompt-lookup-policy", "gated"], tmp_path, monkeypatch, text)
    assert seen["run"].options.generation.max_tokens == 5 and seen["run"].draft.lookup.policy == "gated"


def test_default_location_is_read(tmp_path, monkeypatch):
    (tmp_path / "xdg" / "mlxcel").mkdir(parents=True)
    (tmp_path / "xdg" / "mlxcel" / "config.toml").write_text("max-tokens = 7\n")
    r, seen = invoke(["generate", "-p", "x"], tmp_path, monkeypatch)
    assert r.exit_code == 0 and seen["run"].options.generation.max_tokens == 7


def test_unknown_key_and_wrong_type_name_file_and_key(tmp_path, monkeypatch):
    r, seen = invoke(["generate", "-p", "x"], tmp_path, monkeypatch, "max-tokenz = 3\n")
    assert r.exit_code == 2 and "unknown key 'max-tokenz'" in r.stderr and "c.toml" in r.stderr and not seen
    r, seen = invoke(["generate", "-p", "x"], tmp_path, monkeypatch, 'max-tokens = "many"\n')
    assert r.exit_code == 2 and "key 'max-tokens' must be a int" in r.stderr and not seen
    r, seen = invoke(["generate", "-p", "x"], tmp_path, monkeypatch, "[generate]\nport = 1\n")
    assert r.exit_code == 2 and "unknown key 'port' in [generate]" in r.stderr
    r, seen = invoke(["generate", "-p", "x"], tmp_path, monkeypatch, "max-tokens = \n")
    assert r.exit_code == 2 and "invalid TOML" in r.stderr
