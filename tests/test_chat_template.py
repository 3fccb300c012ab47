"""`--chat-template NAME|TEMPLATE`, `--chat-template-file` and `--jinja` (llama-server's flags): the
template replaces the model's own on every command; a bad one is refused before any model loads."""

from __future__ import annotations

import subprocess

import pytest
from conftest import mlxcel_cmd

from mlxcel_py.commands._options import build_options
from mlxcel_py.errors import UsageError
from mlxcel_py.formats.prompting import render_messages
from mlxcel_py.session import open_session
from mlxcel_py.validate import validate

HI = [{"role": "user", "content": "hi"}]


def rendered(tiny_dir, **params) -> str:
    s = open_session(validate(build_options("generate", {"prompt": "x", "model": str(tiny_dir), **params})))
    return s.tokenizer.decode(render_messages(s.tokenizer, HI))


def test_a_named_template_a_template_text_and_a_file_replace_the_models_own(tiny_dir, tmp_path):
    own = rendered(tiny_dir)
    assert own.startswith("<|im_start|>")  # the tiny model's ChatML
    assert rendered(tiny_dir, chat_template="llama3").endswith(
        "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert rendered(tiny_dir, chat_template="{% for m in messages %}[{{ m['content'] }}]{% endfor %}") == "[hi]"
    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>")
    assert rendered(tiny_dir, chat_template_file=str(f)) == "<user>hi<assistant>"


@pytest.mark.parametrize(
    "params,message",
    [
        (
            {"chat_template": "vicuna-9000"},
            "'vicuna-9000' is neither a Jinja template nor one of: bailing, bailing-think, bailing2, chatglm3",
        ),
        ({"chat_template": "{% for m in messages %}"}, "--chat-template: the template does not parse"),
        ({"chat_template_file": "/nonexistent.jinja"}, "--chat-template-file /nonexistent.jinja: no such file"),
        ({"chat_template": "chatml", "chat_template_file": "/x"}, "both set the template"),
    ],
)
def test_bad_templates_are_refused_before_loading(params, message, no_weights):
    with pytest.raises(UsageError, match=message):
        validate(build_options("serve", params))


def test_jinja_is_accepted(cli_env):
    r = subprocess.run(
        mlxcel_cmd() + ["generate", "-p", "x", "--jinja", "--chat-template", "chatml", "-m", "/nonexistent-model"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
    )
    assert r.returncode == 1 and "--model /nonexistent-model: no such file or folder" in r.stderr, r.stderr


def test_a_built_in_prints_no_bos_the_vocabulary_does_not_add(tiny_dir, tmp_path):
    """SmolLM2's bos_token is <|im_start|>, which its vocabulary never puts first: `--chat-template
    llama3` must not open the prompt with it (llama-server's tokenizer adds no BOS there either)."""
    import json
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_dir, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "bos_token": "<|im_start|>"}))
    text = rendered(folder, chat_template="llama3")
    assert text.startswith("<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"), text
