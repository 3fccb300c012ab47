"""llama-server's built-in chat template names (`--chat-template llama2`, `gpt-oss`...) as Jinja.

llama.cpp formats these names in C++ (src/llama-chat.cpp, `llm_chat_apply_template`), not with a
template; each entry here writes the same text as Jinja, so the session renders a name the way it
renders a model's own template. Each is tested against the text llama.cpp's
tests/test-chat-template.cpp expects (tests/test_named_templates.py), or, where that file has no
case, against llama-chat.cpp's format written out.

As there, the text has no BOS: llama.cpp's tokenizer adds it where the vocabulary asks. Formats
that ignore `add_generation_prompt` there (llama2, mistral-v1/v3, minicpm, rwkv-world,
hunyuan...) ignore it here too: their user turn already ends where the reply starts.
"""

from __future__ import annotations

_S, _U, _A = "system", "user", "assistant"
_EOS_DS = "<\uff5cend\u2581of\u2581sentence\uff5c>"  # DeepSeek's <｜end▁of▁sentence｜>
_TRIM = "m['content'] | trim"


def _turns(
    open_: dict[str, str], close: dict[str, str], gen: str | None, content: str = "m['content']", head: str = ""
) -> str:
    """A turn format: each role's text before and after its content (a role not listed is left
    out, as llama.cpp does), then the reply's opening (None: the format has none). `content` may
    be a dict by role (trimmed for some roles only)."""
    parts = []
    for i, (role, before) in enumerate(open_.items()):
        text = content.get(role, "m['content']") if isinstance(content, dict) else content
        parts.append(
            f"{{% {'if' if i == 0 else 'elif'} m['role'] == {role!r} %}}{{{{ {before!r} + {text} + {close[role]!r} }}}}"
        )
    reply = f"{{% if add_generation_prompt %}}{{{{ {gen!r} }}}}{{% endif %}}" if gen is not None else ""
    return f"{head}{{% for m in messages %}}{''.join(parts)}{{% endif %}}{{% endfor %}}{reply}"


def _each(turn: str, gen: str | None, head: str = "") -> str:
    """Every message as `turn` (a Jinja expression over `m`), then the reply's opening."""
    reply = f"{{% if add_generation_prompt %}}{{{{ {gen!r} }}}}{{% endif %}}" if gen is not None else ""
    return f"{head}{{% for m in messages %}}{{{{ {turn} }}}}{{% endfor %}}{reply}"


def _llama2(system: bool, bos_inside: bool, strip: bool) -> str:
    """Llama 2's [INST] turns: llama2 (a system message as plain text), -sys (<<SYS>>), -sys-bos
    (<s> before each later turn), -sys-strip (contents trimmed)."""
    c = _TRIM if strip else "m['content']"
    sys = f"'<<SYS>>\\n' + {c} + '\\n<</SYS>>\\n\\n'" if system else f"{c} + '\\n'"
    reopen = "<s>[INST] " if bos_inside else "[INST] "
    return (
        "{{ '[INST] ' }}{% set ns = namespace(inside=true) %}{% for m in messages %}"
        f"{{% if not ns.inside %}}{{% set ns.inside = true %}}{{{{ {reopen!r} }}}}{{% endif %}}"
        f"{{% if m['role'] == 'system' %}}{{{{ {sys} }}}}{{% elif m['role'] == 'user' %}}{{{{ {c} + ' [/INST]' }}}}"
        f"{{% else %}}{{{{ {c} + '</s>' }}}}{{% set ns.inside = false %}}{{% endif %}}{{% endfor %}}"
    )


def _mistral(lead: str, trail: str, trim_reply: bool) -> str:
    """Mistral's v1 / v3 / v3-tekken turns: a system message inside the first [INST]."""
    reply = _TRIM if trim_reply else "m['content']"
    return (
        "{% set ns = namespace(inside=false) %}{% for m in messages %}"
        f"{{% if not ns.inside %}}{{{{ {lead + '[INST]' + trail!r} }}}}{{% set ns.inside = true %}}{{% endif %}}"
        "{% if m['role'] == 'system' %}{{ m['content'] + '\\n\\n' }}"
        f"{{% elif m['role'] == 'user' %}}{{{{ m['content'] + {lead + '[/INST]'!r} }}}}"
        f"{{% else %}}{{{{ {trail!r} + {reply} + '</s>' }}}}{{% set ns.inside = false %}}{{% endif %}}{{% endfor %}}"
    )


def _mistral7(space: str) -> str:
    """Mistral's v7 turns ([SYSTEM_PROMPT] ... [/SYSTEM_PROMPT]); v7 puts a space after each opening."""
    return (
        "{% for m in messages %}"
        f"{{% if m['role'] == 'system' %}}{{{{ '[SYSTEM_PROMPT]{space}' + m['content'] + '[/SYSTEM_PROMPT]' }}}}"
        f"{{% elif m['role'] == 'user' %}}{{{{ '[INST]{space}' + m['content'] + '[/INST]' }}}}"
        f"{{% else %}}{{{{ '{space}' + m['content'] + '</s>' }}}}{{% endif %}}{{% endfor %}}"
    )


def _role(table: dict[str, str], default: str = "m['role'] | upper") -> str:
    """A Jinja expression naming `m`'s role as the format spells it."""
    expr = default
    for role, name in reversed(table.items()):
        expr = f"({name!r} if m['role'] == {role!r} else {expr})"
    return expr


_GEMMA = (
    "{% set ns = namespace(system='') %}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% set ns.system = ns.system + m['content'] | trim %}"
    "{% else %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' }}"
    "{% if ns.system and role != 'model' %}{{ ns.system + '\\n\\n' }}{% set ns.system = '' %}{% endif %}"
    "{{ m['content'] | trim + '<end_of_turn>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
_ORION = (
    "{% set ns = namespace(system='') %}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% set ns.system = ns.system + m['content'] %}"
    "{% elif m['role'] == 'user' %}{{ 'Human: ' }}"
    "{% if ns.system %}{{ ns.system + '\\n\\n' }}{% set ns.system = '' %}{% endif %}"
    "{{ m['content'] + '\\n\\nAssistant: </s>' }}{% else %}{{ m['content'] + '</s>' }}{% endif %}{% endfor %}"
)
_EXAONE_TURNS = {_S: "[|system|]", _U: "[|user|]", _A: "[|assistant|]"}
_EXAONE_ENDS = {_S: "[|endofturn|]\n", _U: "\n", _A: "[|endofturn|]\n"}
_GRANITE = "'<|start_of_role|>' + m['role'] + '<|end_of_role|>' + ('<|tool_call|>' if m['role'] == 'assistant_tool_call' else '') + m['content'] + '<|end_of_text|>\\n'"
_GRANITE4 = "('<|start_of_role|>assistant<|end_of_role|><|tool_call|>' if m['role'] == 'assistant_tool_call' else '<|start_of_role|>' + m['role'] + '<|end_of_role|>') + m['content'] + '<|end_of_text|>\\n'"
_BAILING_ROLE = _role({_U: "HUMAN"})
_HY = {
    "a": "<\uff5chy_Assistant\uff5c>",
    "u": "<\uff5chy_User\uff5c>",
    "p2": "<\uff5chy_place\u2581holder\u2581no\u25812\uff5c>",
    "p3": "<\uff5chy_place\u2581holder\u2581no\u25813\uff5c>",
}
_PANGU = {_S: "系统", _U: "用户", _A: "助手", "tool": "工具", "function": "方法"}

NAMED = {
    "llama2": _llama2(system=False, bos_inside=False, strip=False),
    "llama2-sys": _llama2(system=True, bos_inside=False, strip=False),
    "llama2-sys-bos": _llama2(system=True, bos_inside=True, strip=False),
    "llama2-sys-strip": _llama2(system=True, bos_inside=False, strip=True),
    "mistral-v1": _mistral(" ", " ", trim_reply=False),
    "mistral-v3": _mistral("", " ", trim_reply=True),
    "mistral-v3-tekken": _mistral("", "", trim_reply=False),
    "mistral-v7": _mistral7(" "),
    "mistral-v7-tekken": _mistral7(""),
    "phi4": _each(
        "'<|im_start|>' + m['role'] + '<|im_sep|>' + m['content'] + '<|im_end|>'", "<|im_start|>assistant<|im_sep|>"
    ),
    "falcon3": _each("'<|' + m['role'] + '|>\\n' + m['content'] + '\\n'", "<|assistant|>\n"),
    "zephyr": _each("'<|' + m['role'] + '|>\\n' + m['content'] + '<|endoftext|>\\n'", "<|assistant|>\n"),
    "monarch": _each("('' if loop.first else '<s>') + m['role'] + '\\n' + m['content'] + '</s>\\n'", "<s>assistant\n"),
    "gemma": _GEMMA,
    "orion": _ORION,
    "openchat": _each(
        "m['content'] + '<|end_of_turn|>' if m['role'] == 'system' else "
        "'GPT4 Correct ' + m['role'][:1] | upper + m['role'][1:] + ': ' + m['content'] + '<|end_of_turn|>'",
        "GPT4 Correct Assistant:",
    ),
    "vicuna": _turns({_S: "", _U: "USER: ", _A: "ASSISTANT: "}, {_S: "\n\n", _U: "\n", _A: "</s>\n"}, "ASSISTANT:"),
    "vicuna-orca": _turns(
        {_S: "SYSTEM: ", _U: "USER: ", _A: "ASSISTANT: "}, {_S: "\n", _U: "\n", _A: "</s>\n"}, "ASSISTANT:"
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
    "deepseek-ocr": _each("m['content']", None),
    "command-r": _turns(
        {r: f"<|START_OF_TURN_TOKEN|><|{t}_TOKEN|>" for r, t in ((_S, "SYSTEM"), (_U, "USER"), (_A, "CHATBOT"))},
        dict.fromkeys((_S, _U, _A), "<|END_OF_TURN_TOKEN|>"),
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
        content=_TRIM,
    ),
    "chatglm3": _each("'<|' + m['role'] + '|>\\n ' + m['content']", "<|assistant|>", head="[gMASK]sop"),
    "chatglm4": _each("'<|' + m['role'] + '|>\\n' + m['content']", "<|assistant|>\n", head="[gMASK]<sop>"),
    "glmedge": _each("'<|' + m['role'] + '|>\\n' + m['content']", "<|assistant|>"),
    "minicpm": _each("('<用户>' + m['content'] | trim + '<AI>') if m['role'] == 'user' else m['content'] | trim", None),
    "exaone3": _turns(_EXAONE_TURNS, _EXAONE_ENDS, "[|assistant|]", content=_TRIM),
    "exaone4": _turns(
        {**_EXAONE_TURNS, "tool": "[|tool|]"},
        {**_EXAONE_ENDS, "tool": "[|endofturn|]\n"},
        "[|assistant|]",
        content=_TRIM,
    ),
    "exaone-moe": _turns(
        {r: f"<|{r}|>\n" for r in (_S, _U, _A, "tool")},
        dict.fromkeys((_S, _U, _A, "tool"), "<|endofturn|>\n"),
        "<|assistant|>\n",
        content=_TRIM,
    ),
    "rwkv-world": (  # the last user turn opens the reply itself; "\n\n" is the model's end of turn
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ 'System: ' + m['content'] | trim + '\\n\\n' }}"
        "{% elif m['role'] == 'user' %}{{ 'User: ' + m['content'] | trim + '\\n\\n' + ('Assistant:' if loop.last else '') }}"
        "{% elif m['role'] == 'assistant' %}{{ 'Assistant: ' + m['content'] | trim + '\\n\\n' }}{% endif %}{% endfor %}"
    ),
    "granite": _each(_GRANITE, "<|start_of_role|>assistant<|end_of_role|>"),
    "granite-4.0": _each(_GRANITE4, "<|start_of_role|>assistant<|end_of_role|>"),
    "gigachat": (
        "{{ '<s>' }}{% for m in messages %}{% if loop.first and m['role'] == 'system' %}"
        "{{ m['content'] + '<|message_sep|>' }}{% elif m['role'] == 'user' %}"
        "{{ 'user<|role_sep|>' + m['content'] + '<|message_sep|>available functions<|role_sep|>[]<|message_sep|>' }}"
        "{% elif m['role'] == 'assistant' %}{{ 'assistant<|role_sep|>' + m['content'] + '<|message_sep|>' }}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'assistant<|role_sep|>' }}{% endif %}"
    ),
    "megrez": _each(
        "'<|role_start|>' + m['role'] + '<|role_end|>' + m['content'] + '<|turn_end|>'",
        "<|role_start|>assistant<|role_end|>",
    ),
    "yandex": _turns({_U: " Пользователь: ", _A: " Ассистент: "}, {_U: "\n\n", _A: "\n\n"}, " Ассистент:[SEP]"),
    "bailing": _each(f"'<role>' + {_BAILING_ROLE} + '</role>' + m['content']", "<role>ASSISTANT</role>"),
    "bailing-think": _each(f"'<role>' + {_BAILING_ROLE} + '</role>' + m['content']", "<role>ASSISTANT</role><think>"),
    "bailing2": _each(
        f"'<role>' + {_BAILING_ROLE} + '</role>' + m['content'] + '<|role_end|>'",
        "<role>ASSISTANT</role>",
        head="{% if not messages or messages[0]['role'] != 'system' %}"
        "{{ '<role>SYSTEM</role>detailed thinking off<|role_end|>' }}{% endif %}",
    ),
    "llama4": _each(
        "'<|header_start|>' + m['role'] + '<|header_end|>\\n\\n' + m['content'] | trim + '<|eot|>'",
        "<|header_start|>assistant<|header_end|>\n\n",
    ),
    "smolvlm": _each(
        "m['content'] + '\\n\\n' if m['role'] == 'system' else "
        "('User: ' if m['role'] == 'user' else 'Assistant: ') + m['content'] + '<end_of_utterance>\\n'",
        "Assistant:",
        head="{{ '<|im_start|>' }}",
    ),
    "hunyuan-moe": _each(
        "'<|startoftext|>' + m['content'] + '<|extra_4|>' if m['role'] == 'system' else "
        "m['content'] + '<|eos|>' if m['role'] == 'assistant' else '<|startoftext|>' + m['content'] + '<|extra_0|>'",
        None,
    ),
    "gpt-oss": _each(
        "'<|start|>' + m['role'] + '<|message|>' + m['content'] + ('<|return|>' if m['role'] == 'assistant' else '<|end|>')",
        "<|start|>assistant",
    ),
    "hunyuan-dense": _each(
        f"(m['content'] + {_HY['p3']!r} if loop.first and m['role'] == 'system' else '') + "
        f"({_HY['a']!r} + m['content'] + {_HY['p2']!r} if m['role'] == 'assistant' else "
        f"{_HY['u']!r} + m['content'] + {_HY['a']!r} if m['role'] == 'user' else '')",
        None,
    ),
    "kimi-k2": _each(
        _role(
            {
                _S: "<|im_system|>system<|im_middle|>",
                _U: "<|im_user|>user<|im_middle|>",
                _A: "<|im_assistant|>assistant<|im_middle|>",
                "tool": "<|im_system|>tool<|im_middle|>",
            },
            default="''",
        )
        + " + m['content'] + '<|im_end|>'",
        "<|im_assistant|>assistant<|im_middle|>",
    ),
    "seed_oss": _each(
        "'<seed:bos>' + m['role'] + '\\n' + (m['content'] | trim if m['role'] == 'assistant' else m['content']) + '<seed:eos>'",
        "<seed:bos>assistant\n",
    ),
    "grok-2": _turns(
        {_S: "System: ", _U: "Human: ", _A: "Assistant: "},
        dict.fromkeys((_S, _U, _A), "<|separator|>\n\n"),
        "Assistant:",
        content={_S: _TRIM, _U: _TRIM},
    ),
    "pangu-embedded": _each(
        "('[unused9]系统：[unused10]' if loop.first and m['role'] != 'system' else '') + "
        f"('[unused9]' + {_role(_PANGU, default=repr(''))} + '：' + m['content'] + '[unused10]' "
        f"if m['role'] in {list(_PANGU)!r} else '')",
        "[unused9]助手：",
    ),
    "solar-open": _each("'<|begin|>' + m['role'] + '<|content|>' + m['content'] + '<|end|>'", "<|begin|>assistant"),
}
