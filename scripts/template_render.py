"""Real chat templates through mlxcel-py's renderer, side by side with transformers' own.

    python scripts/template_render.py TEMPLATE.jinja [...] [-m MODEL]
    python scripts/template_render.py ~/src/llama.cpp/models/templates/*.jinja

Templates are the models' own (a llama.cpp checkout's models/templates, a model's
tokenizer_config.json chat_template saved to a file); none ship with this repository, their
licences being their authors'. For each template, three conversations (a question; a system turn
and a reply in the history; tools offered with an assistant call and its result) are rendered:

- by mlxcel-py: the template checked as `--chat-template-file` checks it, then rendered by
  formats/prompting.render_messages on the model's tokenizer (today's date and the rest of what
  llama.cpp passes beside the messages), and the ids decoded;
- by transformers' `render_jinja_template` with the same variables.

A template passes when it renders without error and both texts are equal. Exit status 1 when any
template fails. The model only supplies a tokenizer (default: the default model's).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlxcel_py.formats import chat_templates
from mlxcel_py.formats.prompting import render_messages, template_extras

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
CONVERSATIONS = {
    "question": ([{"role": "user", "content": "What is today?"}], None),
    "history": (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "What is today?"},
        ],
        None,
    ),
    "tools": (
        [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"},
        ],
        TOOLS,
    ),
}


def reference(tokenizer, template: str, messages: list[dict], tools) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    specials = {k: v for k, v in (inner.special_tokens_map or {}).items() if isinstance(v, str)}
    out = render_jinja_template(
        conversations=[messages],
        tools=tools,
        chat_template=template,
        add_generation_prompt=True,
        **specials,
        **template_extras(template),
    )
    rendered = out[0] if isinstance(out, tuple) else out
    return rendered[0] if isinstance(rendered, list) else rendered


def ours(tokenizer, template: str, messages: list[dict], tools) -> str:
    chat_templates.check(template)
    getattr(tokenizer, "_tokenizer", tokenizer).chat_template = template
    tokenizer.has_chat_template = True
    return tokenizer.decode(render_messages(tokenizer, messages, tools=tools))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("templates", nargs="+", type=Path)
    ap.add_argument("-m", "--model", default=None, help="a model whose tokenizer renders (default: the default model)")
    args = ap.parse_args()
    from mlxcel_py.models import loading

    tokenizer = loading.load_tokenizer_only(loading.resolve(args.model))
    failed = 0
    for path in args.templates:
        template = path.read_text(encoding="utf-8")
        results = []
        for name, (messages, tools) in CONVERSATIONS.items():
            try:
                want = reference(tokenizer, template, messages, tools)
            except Exception as exc:  # the template refuses this conversation: ours must refuse too
                want = f"refused: {type(exc).__name__}"
            try:
                got = ours(tokenizer, template, messages, tools)
            except Exception as exc:
                got = f"refused: {type(exc).__name__}"
            results.append((name, got == want, got, want))
        bad = [r for r in results if not r[1]]
        failed += bool(bad)
        print(
            f"{'ok  ' if not bad else 'FAIL'} {path.name}: "
            + ", ".join(f"{n} {'=' if ok else '!='}" for n, ok, *_ in results)
        )
        for name, _, got, want in bad:
            print(f"     {name}: mlxcel-py {got[-120:]!r}\n     {' ' * len(name)}  transformers {want[-120:]!r}")
    print(f"{len(args.templates) - failed}/{len(args.templates)} templates render as transformers renders them")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
