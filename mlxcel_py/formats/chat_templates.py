"""Chat templates by name, for `--chat-template NAME` (llama-server's flag), and the check that a
template given as text compiles. Pure (jinja2 parses, nothing renders), so a bad template is
refused before any model loads; the session puts the chosen one on the tokenizer.

The built-ins are the common turn formats, written for mlxcel-py (not copies of any model's
file), and llama-server's ~50 names; a model's own template, or one given as text or a file,
does everything else.
"""

from __future__ import annotations

from .llama_cpp_templates import NAMED

_CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_LLAMA3 = (
    "{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
_MISTRAL = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ '[SYSTEM_PROMPT]' + m['content'] + '[/SYSTEM_PROMPT]' }}"
    "{% elif m['role'] == 'user' %}{{ '[INST]' + m['content'] + '[/INST]' }}"
    "{% else %}{{ m['content'] + eos_token }}{% endif %}{% endfor %}"
)
_PHI3 = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

# llama-server's names as llama.cpp formats them (llama_cpp_templates.py), and mlxcel's own four;
# none prints a BOS: with_vocab_bos puts one first where the vocabulary adds one
BUILTIN = {
    **NAMED,
    "chatml": _CHATML,
    "llama3": _LLAMA3,
    "mistral": _MISTRAL,
    "phi3": _PHI3,
}
_BUILTIN_TEXTS = frozenset(BUILTIN.values())


def with_vocab_bos(text: str, adds_bos: bool) -> str:
    """llama-server renders its named formats without a BOS and lets the tokenizer add one where
    the vocabulary says add_bos (Llama 2 and 3, Mistral, Gemma...); the engine tokenizes a
    rendered template as it is, so a built-in on such a vocabulary prints the BOS itself, and on
    any other none (SmolLM2's bos_token is <|im_start|>, which its vocabulary never adds)."""
    if adds_bos and text in _BUILTIN_TEXTS and "bos_token" not in text:
        return "{{ bos_token }}" + text
    return text


class TemplateError(ValueError):
    """A template that does not parse, or a name that is none of BUILTIN."""


def resolve(value: str) -> str:
    """A built-in's text by name, or `value` itself as a template. Text without Jinja tags is a
    template too (llama-server renders it as it is), unless it is one word: that is a name this
    table lacks, and a typo must not become the prompt."""
    if value in BUILTIN:
        return BUILTIN[value]
    if "{{" not in value and "{%" not in value and len(value.split()) <= 1:
        raise TemplateError(f"{value!r} is neither a Jinja template nor one of: {', '.join(sorted(BUILTIN))}")
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
