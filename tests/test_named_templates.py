"""llama-server's built-in template names (`--chat-template command-r` ...), each rendered on
llama.cpp's own test conversation and compared with the text llama.cpp's
tests/test-chat-template.cpp expects from that name's format (its legacy `expected_output`), or
with src/llama-chat.cpp's format written out where that file has no case."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest
from test_template_compat import client_for, tokenizer  # noqa: F401 (a fixture)

from mlxcel_py.formats import chat_templates
from mlxcel_py.formats.llama_cpp_templates import NAMED

# {"conversation": llama.cpp's test conversation, "cases": {name: {"source", "expected", ["template",
# "extra"]}}}: "source" says where the text comes from, llama.cpp's tests/test-chat-template.cpp
# (its `expected_output`) or, for a name that file has no case for, src/llama-chat.cpp's format
# written out by hand
CASES = json.loads((Path(__file__).parent / "llama_cpp_named_templates.json").read_text())
CONVERSATION = CASES["conversation"]
CR = "<|START_OF_TURN_TOKEN|>"
# formats that print nothing for the reply's opening in llama.cpp (their user turn ends where the
# reply starts, or they have no such marker)
NO_REPLY_OPENING = {
    "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "mistral-v1", "mistral-v3",
    "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "orion", "minicpm", "rwkv-world",
    "hunyuan-moe", "hunyuan-dense", "deepseek-ocr",
}  # fmt: skip


def render(text: str, messages: list[dict], add_generation_prompt: bool = True) -> str:
    env = jinja2.Environment(extensions=list(chat_templates.EXTENSIONS))
    return env.from_string(text).render(messages=messages, add_generation_prompt=add_generation_prompt, bos_token="")


@pytest.mark.parametrize("case", sorted(CASES["cases"]))
def test_a_llama_server_template_name_renders_as_llama_cpp_formats_it(case):
    spec = CASES["cases"][case]
    name = spec.get("template", case)
    text = chat_templates.resolve(name)
    chat_templates.check(text)
    rendered = render(text, CONVERSATION + spec.get("extra", []))
    assert rendered == spec["expected"]
    without = render(text, CONVERSATION + spec.get("extra", []), add_generation_prompt=False)
    if name in NO_REPLY_OPENING:
        assert rendered == without
    else:
        assert rendered.startswith(without) and rendered != without


def test_every_llama_server_name_is_known_and_tested():
    """llama.cpp's LLM_CHAT_TEMPLATES names (src/llama-chat.cpp), all accepted by --chat-template."""
    llama_cpp_names = {
        "chatml", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "mistral-v1", "mistral-v3",
        "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "phi3", "phi4", "falcon3", "zephyr", "monarch",
        "gemma", "orion", "openchat", "vicuna", "vicuna-orca", "deepseek", "deepseek2", "deepseek3",
        "deepseek-ocr", "command-r", "llama3", "chatglm3", "chatglm4", "glmedge", "minicpm", "exaone3", "exaone4",
        "exaone-moe", "rwkv-world", "granite", "granite-4.0", "gigachat", "megrez", "yandex", "bailing",
        "bailing-think", "bailing2", "llama4", "smolvlm", "hunyuan-moe", "gpt-oss", "hunyuan-dense", "kimi-k2",
        "seed_oss", "grok-2", "pangu-embedded", "solar-open",
    }  # fmt: skip
    assert llama_cpp_names <= set(chat_templates.BUILTIN)
    assert set(NAMED) <= set(CASES["cases"])


@pytest.mark.parametrize("adds_bos", [True, False])
def test_gemma_merges_a_system_message_into_the_next_user_turn_after_the_vocabularys_bos(adds_bos):
    """llama.cpp's gemma format (no system turn in Gemma): the system text opens the user's turn;
    the BOS comes first only where the vocabulary adds one, as llama-server's tokenizer puts it."""
    text = chat_templates.with_vocab_bos(chat_templates.resolve("gemma"), adds_bos)
    messages = [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi"}]
    rendered = (
        jinja2.Environment().from_string(text).render(messages=messages, add_generation_prompt=True, bos_token="<bos>")
    )
    bos = "<bos>" if adds_bos else ""
    assert rendered == bos + "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"


def test_a_one_word_name_that_is_not_built_in_is_refused_with_the_list():
    with pytest.raises(
        chat_templates.TemplateError, match="neither a Jinja template nor one of: bailing, bailing-think"
    ):
        chat_templates.resolve("llama9")


def test_command_r_by_name_through_apply_template_as_llama_cpp_s_suite(tokenizer):  # noqa: F811
    """llama.cpp's test_apply_chat_template: `--chat-template command-r` was refused at startup."""
    client, _ = client_for(tokenizer, chat_templates.resolve("command-r"))
    r = client.post(
        "/apply-template",
        json={"messages": [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Hi there"}]},
    )
    assert r.status_code == 200 and r.json()["prompt"] == (
        f"{CR}<|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>{CR}<|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
        f"{CR}<|CHATBOT_TOKEN|>"
    )
