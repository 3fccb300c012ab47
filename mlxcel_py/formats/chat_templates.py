"""Chat templates by name, for `--chat-template NAME` (llama-server's flag), and the check that a
template given as text compiles. Pure (jinja2 parses, nothing renders), so a bad template is
refused before any model loads; the session puts the chosen one on the tokenizer.

The built-ins are the common turn formats, written for mlxcel-py (not copies of any model's
file); a model's own template, or one given as text or a file, does everything else.
"""

from __future__ import annotations

_CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
_MISTRAL = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ '[SYSTEM_PROMPT]' + m['content'] + '[/SYSTEM_PROMPT]' }}"
    "{% elif m['role'] == 'user' %}{{ '[INST]' + m['content'] + '[/INST]' }}"
    "{% else %}{{ m['content'] + eos_token }}{% endif %}{% endfor %}"
)
_GEMMA = (
    "{{ bos_token }}{% for m in messages %}"
    "{% set role = 'model' if m['role'] == 'assistant' else 'user' %}"
    "{{ '<start_of_turn>' + role + '\\n' + m['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
_PHI3 = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def _turns(open_: dict[str, str], close: dict[str, str], gen: str, content: str = "m['content']") -> str:
    """A turn format as llama.cpp's named templates write it (src/llama-chat.cpp): each role's text
    before and after its content (a role not listed is left out, as there), then the reply's opening."""
    parts = []
    for i, (role, before) in enumerate(open_.items()):
        parts.append(
            f"{{% {'if' if i == 0 else 'elif'} m['role'] == {role!r} %}}{{{{ {before!r} + {content} + {close[role]!r} }}}}"
        )
    return f"{{% for m in messages %}}{''.join(parts)}{{% endif %}}{{% endfor %}}{{% if add_generation_prompt %}}{{{{ {gen!r} }}}}{{% endif %}}"


_S, _U, _A = "system", "user", "assistant"
_EOS_DS = "<\uff5cend\u2581of\u2581sentence\uff5c>"  # DeepSeek's <｜end▁of▁sentence｜>
# llama-server's other built-in names (llama.cpp's llm_chat_apply_template formats; tested against the
# outputs llama.cpp's tests/test-chat-template.cpp expects)
_LLAMA_CPP_NAMED = {
    "command-r": _turns(
        {r: f"<|START_OF_TURN_TOKEN|><|{t}_TOKEN|>" for r, t in ((_S, "SYSTEM"), (_U, "USER"), (_A, "CHATBOT"))},
        dict.fromkeys((_S, _U, _A), "<|END_OF_TURN_TOKEN|>"),
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
        content="m['content'] | trim",
    ),
    "vicuna": _turns({_S: "", _U: "USER: ", _A: "ASSISTANT: "}, {_S: "\n\n", _U: "\n", _A: "</s>\n"}, "ASSISTANT:"),
    "vicuna-orca": _turns(
        {_S: "SYSTEM: ", _U: "USER: ", _A: "ASSISTANT: "}, {_S: "\n", _U: "\n", _A: "</s>\n"}, "ASSISTANT:"
    ),
    "zephyr": (
        "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|endoftext|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
    ),
    "deepseek": _turns(
        {_S: "", _U: "### Instruction:\n", _A: "### Response:\n"},
        {_S: "", _U: "\n", _A: "\n<|EOT|>\n"},
        "### Response:\n",
    ),
    "deepseek2": _turns({_S: "", _U: "User: ", _A: "Assistant: "}, {_S: "\n\n", _U: "\n\n", _A: _EOS_DS}, "Assistant:"),
    "deepseek3": _turns(
        {_S: "", _U: "<\uff5cUser\uff5c>", _A: "<\uff5cAssistant\uff5c>"},
        {_S: "\n\n", _U: "", _A: _EOS_DS},
        "<\uff5cAssistant\uff5c>",
    ),
    "openchat": (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] + '<|end_of_turn|>' }}"
        "{% else %}{{ 'GPT4 Correct ' + m['role'][:1] | upper + m['role'][1:] + ': ' + m['content'] + '<|end_of_turn|>' }}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'GPT4 Correct Assistant:' }}{% endif %}"
    ),
    "phi4": (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '<|im_sep|>' + m['content'] + '<|im_end|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}"
    ),
    "bailing": (
        "{% for m in messages %}{{ '<role>' + ('HUMAN' if m['role'] == 'user' else m['role'] | upper) + '</role>' + m['content'] }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<role>ASSISTANT</role>' }}{% endif %}"
    ),
}
BUILTIN = {
    "chatml": _CHATML,
    "llama3": _LLAMA3,
    "mistral": _MISTRAL,
    "gemma": _GEMMA,
    "phi3": _PHI3,
    **_LLAMA_CPP_NAMED,
}


class TemplateError(ValueError):
    """A template that does not parse, or a name that is none of BUILTIN."""


def resolve(value: str) -> str:
    """A built-in's text by name, or `value` itself as a template. Text without Jinja tags is a
    template too (llama-server renders it as it is), unless it is one word: that is a name this
    table lacks (llama-server knows more: chatglm4, exaone3...), and a typo must not become the prompt."""
    if value in BUILTIN:
        return BUILTIN[value]
    if "{{" not in value and "{%" not in value and len(value.split()) <= 1:
        raise TemplateError(f"{value!r} is neither a Jinja template nor one of: {', '.join(BUILTIN)}")
    check(value)
    return value


# the Jinja extensions transformers' and llama.cpp's renderers enable ({% break %}, {% continue %})
EXTENSIONS = ("jinja2.ext.loopcontrols",)


def check(text: str) -> None:
    import jinja2

    try:
        jinja2.Environment(extensions=list(EXTENSIONS)).parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"the template does not parse (line {exc.lineno}: {exc.message})") from None
