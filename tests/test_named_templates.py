"""llama-server's built-in template names (`--chat-template command-r` ...), each rendered on
llama.cpp's own test conversation and compared with the text llama.cpp's
tests/test-chat-template.cpp expects from that name's format (its legacy `expected_output`)."""

from __future__ import annotations

import jinja2
import pytest
from test_template_compat import client_for, tokenizer  # noqa: F401 (a fixture)

from mlxcel_py.formats import chat_templates

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"},
    {"role": "user", "content": "Who are you"},
    {"role": "assistant", "content": "   I am an assistant   "},
    {"role": "user", "content": "Another question"},
]
EOS_DS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
CR = "<|START_OF_TURN_TOKEN|>"
EXPECTED = {
    "command-r": f"{CR}<|SYSTEM_TOKEN|>You are a helpful assistant<|END_OF_TURN_TOKEN|>{CR}<|USER_TOKEN|>Hello"
    f"<|END_OF_TURN_TOKEN|>{CR}<|CHATBOT_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>{CR}<|USER_TOKEN|>Who are you"
    f"<|END_OF_TURN_TOKEN|>{CR}<|CHATBOT_TOKEN|>I am an assistant<|END_OF_TURN_TOKEN|>{CR}<|USER_TOKEN|>"
    f"Another question<|END_OF_TURN_TOKEN|>{CR}<|CHATBOT_TOKEN|>",
    "vicuna": "You are a helpful assistant\n\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\n"
    "ASSISTANT:    I am an assistant   </s>\nUSER: Another question\nASSISTANT:",
    "vicuna-orca": "SYSTEM: You are a helpful assistant\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\n"
    "ASSISTANT:    I am an assistant   </s>\nUSER: Another question\nASSISTANT:",
    "deepseek": "You are a helpful assistant### Instruction:\nHello\n### Response:\nHi there\n<|EOT|>\n"
    "### Instruction:\nWho are you\n### Response:\n   I am an assistant   \n<|EOT|>\n### Instruction:\n"
    "Another question\n### Response:\n",
    "deepseek2": f"You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there{EOS_DS}User: Who are you\n\n"
    f"Assistant:    I am an assistant   {EOS_DS}User: Another question\n\nAssistant:",
    "openchat": "You are a helpful assistant<|end_of_turn|>GPT4 Correct User: Hello<|end_of_turn|>GPT4 Correct "
    "Assistant: Hi there<|end_of_turn|>GPT4 Correct User: Who are you<|end_of_turn|>GPT4 Correct Assistant:    "
    "I am an assistant   <|end_of_turn|>GPT4 Correct User: Another question<|end_of_turn|>GPT4 Correct Assistant:",
    "phi4": "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user<|im_sep|>Hello"
    "<|im_end|><|im_start|>assistant<|im_sep|>Hi there<|im_end|><|im_start|>user<|im_sep|>Who are you<|im_end|>"
    "<|im_start|>assistant<|im_sep|>   I am an assistant   <|im_end|><|im_start|>user<|im_sep|>Another question"
    "<|im_end|><|im_start|>assistant<|im_sep|>",
    "bailing": "<role>SYSTEM</role>You are a helpful assistant<role>HUMAN</role>Hello<role>ASSISTANT</role>Hi there"
    "<role>HUMAN</role>Who are you<role>ASSISTANT</role>   I am an assistant   <role>HUMAN</role>Another question"
    "<role>ASSISTANT</role>",
    # no case in llama.cpp's test file: its src/llama-chat.cpp format, written out
    "zephyr": "<|system|>\nYou are a helpful assistant<|endoftext|>\n<|user|>\nHello<|endoftext|>\n<|assistant|>\n"
    "Hi there<|endoftext|>\n<|user|>\nWho are you<|endoftext|>\n<|assistant|>\n   I am an assistant   "
    "<|endoftext|>\n<|user|>\nAnother question<|endoftext|>\n<|assistant|>\n",
    "deepseek3": "You are a helpful assistant\n\n<\uff5cUser\uff5c>Hello<\uff5cAssistant\uff5c>Hi there"
    f"{EOS_DS}<\uff5cUser\uff5c>Who are you<\uff5cAssistant\uff5c>   I am an assistant   {EOS_DS}"
    "<\uff5cUser\uff5c>Another question<\uff5cAssistant\uff5c>",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_llama_server_template_name_renders_as_llama_cpp_formats_it(name):
    text = chat_templates.resolve(name)
    chat_templates.check(text)
    rendered = jinja2.Environment().from_string(text).render(messages=CONVERSATION, add_generation_prompt=True)
    assert rendered == EXPECTED[name]
    without = jinja2.Environment().from_string(text).render(messages=CONVERSATION, add_generation_prompt=False)
    assert rendered.startswith(without) and rendered != without


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
