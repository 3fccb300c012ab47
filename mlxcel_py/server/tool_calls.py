"""Tool calls on the chat route: the tools into the prompt, the reply back into `tool_calls`.

Rendering. A chat template that takes tools (its source uses `tools`: Qwen, Hermes, Llama 3.x,
Mistral...) gets them through transformers' `apply_chat_template(tools=...)`, with assistant
`tool_calls` and `tool` messages of the history passed as the template expects them. A template
that does not (the default model's) gets llama.cpp's generic format instead: a system message
that lists the tools as JSON and asks for `{"tool_call": {"name": ..., "arguments": {...}}}` or
`{"response": "..."}`; earlier calls and results are rendered back in that JSON.

Parsing the reply, in the formats real templates make models emit (llama.cpp's common/chat lists
them): Hermes / Qwen `<tool_call>{json}</tool_call>` blocks, Mistral `[TOOL_CALLS][{...}]`,
Llama 3.x bare `{"name": ..., "parameters": {...}}` (optionally after `<|python_tag|>`), the
generic JSON, and the tag markups of other families (tool_formats: DeepSeek, Kimi K2, Phi-4-mini,
Qwen3-Coder, GLM, MiniMax, Command R7B). A call whose name is not one of the request's tools, or
whose JSON does not parse, is left as text.

Constraint. `tool_choice: "required"` or a named function, and the generic format whenever tools
are offered, constrain decoding to a well-formed reply (grammars.GrammarSpec: a JSON schema for the
generic format, a Lark grammar embedding the arguments' schema for Hermes-style templates), so even
a small model returns a call whose arguments match the tool's parameters.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from ..formats.grammars import GrammarSpec
from ..formats.prompting import template_source
from . import tool_formats
from .image_parts import text_of
from .tool_formats import HERMES_CALL, CallFormat

GENERIC_PROMPT = (
    "You can call these tools (JSON schemas of their arguments):\n{tools}\n\n"
    'Reply with JSON only: {{"tool_call": {{"name": "<tool name>", "arguments": {{...}}}}}} to call a tool, '
    'or {{"response": "<your answer>"}} to answer directly.'
)
# compact JSON in calls: a model's whitespace between tokens could otherwise run on to max_tokens
COMPACT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict
    id: str = ""

    def as_openai(self) -> dict:
        return {
            "id": self.id or f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }


def template_takes_tools(tokenizer: Any) -> bool:
    """Whether the model's chat template renders a `tools` list (else the generic format is used)."""
    return "tools" in template_source(tokenizer)


def special_tokens(tokenizer: Any) -> frozenset[str]:
    """The tokenizer's special tokens that look like `<...>` (a grammar names those as tokens)."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    found = set(getattr(inner, "all_special_tokens", None) or [])
    for added in (getattr(inner, "added_tokens_decoder", None) or {}).values():
        if getattr(added, "special", False):
            found.add(str(added.content))
    return frozenset(t for t in found if len(t) > 2 and t[0] == "<" and t[-1] == ">")


def functions(tools: list[dict]) -> list[dict]:
    """The `function` objects of OpenAI `tools` entries."""
    return [t["function"] for t in tools]


def generic_system(tools: list[dict]) -> str:
    listing = json.dumps(
        [
            {"name": f["name"], "description": f.get("description", ""), "parameters": f.get("parameters", {})}
            for f in functions(tools)
        ],
        ensure_ascii=False,
        indent=1,
    )
    return GENERIC_PROMPT.format(tools=listing)


def generic_turns(turns: list[dict], tools: list[dict]) -> list[dict]:
    """History turns for a template without tools: the tool listing as (or before) the system
    turn, assistant calls and tool results as the generic JSON."""
    out = []
    for t in turns:
        if t["role"] == "assistant" and t.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": _arguments(c["function"])} for c in t["tool_calls"]]
            body = {"tool_call": calls[0]} if len(calls) == 1 else {"tool_calls": calls}
            out.append({"role": "assistant", "content": json.dumps(body, ensure_ascii=False)})
        elif t["role"] == "tool":
            content = t.get("content") or ""
            result = {"tool_response": {"id": t.get("tool_call_id") or "", "content": text_of(content)}}
            body = json.dumps(result, ensure_ascii=False)
            images = [p for p in content if p.get("type") == "image"] if isinstance(content, list) else []
            out.append({"role": "tool", "content": [{"type": "text", "text": body}, *images] if images else body})
        else:
            out.append({"role": t["role"], "content": t.get("content") or ""})
    system = generic_system(tools)
    if out and out[0]["role"] == "system":
        out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + system}
    else:
        out.insert(0, {"role": "system", "content": system})
    return out


def native_turns(turns: list[dict]) -> list[dict]:
    """History turns for a template that takes tools: arguments as objects, as HF templates read
    them, and each tool result named after the call it answers (OpenAI's tool turns carry only
    the call's id; Hermes-style templates refuse a result without `name`): by id, else the
    earliest call of the latest assistant turn not yet answered."""
    out, names, pending = [], {}, []
    for t in turns:
        t = dict(t)
        if t.get("tool_calls"):
            t["tool_calls"] = [
                {**c, "function": {"name": c["function"]["name"], "arguments": _arguments(c["function"])}}
                for c in t["tool_calls"]
            ]
            t.setdefault("content", "")
            if t["content"] is None:
                t["content"] = ""
            pending = [c["function"]["name"] for c in t["tool_calls"]]
            names.update({c["id"]: c["function"]["name"] for c in t["tool_calls"] if c.get("id")})
        elif t["role"] == "tool":
            name = t.get("name") or names.get(t.get("tool_call_id")) or (pending[0] if pending else None)
            if name is not None:
                t["name"] = name
                if name in pending:
                    pending.remove(name)
        out.append(t)
    return out


def _arguments(fn: dict) -> Any:
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args if args is not None else {}


# ---- the grammar of a required or named call, in the template's own format (tool_formats) ----


def lark_text(text: str, special: frozenset[str]) -> str:
    """`text` as a Lark expression: the tokenizer's special tokens as token references (a model
    emits them as one token, never as their characters), the rest as quoted strings."""
    parts, at = [], 0
    marks = sorted((m for m in special if m and m in text), key=len, reverse=True)
    while at < len(text):
        hit = next(((text.find(m, at), m) for m in marks if text.find(m, at) == at), None)
        if hit is not None:
            parts.append(hit[1])
            at += len(hit[1])
            continue
        nxt = min([i for i in (text.find(m, at) for m in marks) if i >= 0] or [len(text)])
        parts.append(json.dumps(text[at:nxt], ensure_ascii=False))
        at = nxt
    return " ".join(parts) if parts else '""'


def constraint(
    tools: list[dict],
    choice: Any,
    *,
    native: bool,
    fmt: CallFormat = HERMES_CALL,
    special: frozenset[str] = frozenset(),
) -> GrammarSpec | None:
    """The grammar a reply must follow: None (free text) unless a call is required, or the
    generic format is in use (its reply is JSON by construction). A required or named call on a
    template that takes tools follows that template's own format (`fmt`, from tool_formats.call_format)."""
    fns = functions(tools)
    if isinstance(choice, dict):
        wanted = choice.get("function", {}).get("name")
        fns = [f for f in fns if f["name"] == wanted]
        required = True
    else:
        required = choice == "required"
    if choice == "none":
        return None
    if not native:
        call = _call_schema(fns, "arguments")
        options = [
            {
                "type": "object",
                "properties": {"tool_call": call},
                "required": ["tool_call"],
                "additionalProperties": False,
            }
        ]
        if not required:
            options.append(
                {
                    "type": "object",
                    "properties": {"response": {"type": "string"}},
                    "required": ["response"],
                    "additionalProperties": False,
                }
            )
        return GrammarSpec("json_schema", json.dumps({"x-guidance": COMPACT, "anyOf": options}))
    if not required:
        return None
    rules = []
    if fmt.named is not None:  # the name outside the JSON: one alternative per function
        before, after = fmt.named
        alts = []
        for i, f in enumerate(fns):
            rules.append(
                f"args{i}: %json {json.dumps({'x-guidance': COMPACT, **closed(f.get('parameters') or {'type': 'object'})})}"
            )
            alts.append(
                " ".join(
                    p
                    for p in (
                        lark_text(before.format(name=f["name"]), special),
                        f"args{i}",
                        lark_text(after, special) if after else "",
                    )
                    if p
                )
            )
        rules.insert(0, "call: " + " | ".join(alts))
    else:
        schema: dict = _call_schema(fns, fmt.arguments)
        if fmt.listed:
            schema = {"type": "array", "items": schema, "minItems": 1, "maxItems": 1}
        rules.insert(0, f"call: %json {json.dumps({'x-guidance': COMPACT, **schema})}")
    start = [lark_text(fmt.open, special)] if fmt.open else []
    start += ["call"] + ([lark_text(fmt.close, special)] if fmt.close else [])
    return GrammarSpec("lark", "start: " + " ".join(start) + "\n" + "\n".join(rules) + "\n")


# an object with one of these at its own level gets (or names) keys from elsewhere: left open
_COMPOSED = ("allOf", "anyOf", "oneOf", "$ref", "if", "dependentSchemas", "unevaluatedProperties", "patternProperties")


def closed(schema: Any) -> Any:
    """A tool's parameter schema with every object that lists its properties closed to others
    unless it says otherwise (`additionalProperties` absent means false), as llama.cpp's grammar
    converter reads tool schemas: a small model under the grammar otherwise keeps inventing keys
    until max_tokens cuts the call open (the default model did, on a real Mistral template).
    Composition is respected: `allOf` members (closing each would make their union impossible),
    `not`/`if` branches, and objects composed at their own level are left as written."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in ("properties", "$defs", "definitions", "patternProperties"):
        if isinstance(out.get(key), dict):
            out[key] = {k: closed(v) for k, v in out[key].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = closed(out[key])
    for key in ("anyOf", "oneOf", "prefixItems"):  # alternatives: each stands alone
        if isinstance(out.get(key), list):
            out[key] = [closed(v) for v in out[key]]
    if (
        isinstance(out.get("properties"), dict)
        and "additionalProperties" not in out
        and not any(k in out for k in _COMPOSED)
    ):
        out["additionalProperties"] = False
    return out


def _call_schema(fns: list[dict], key: str) -> dict:
    """A call object: one of the functions' names, with its arguments under `key`."""
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": f["name"]}, key: closed(f.get("parameters") or {"type": "object"})},
                "required": ["name", key],
                "additionalProperties": False,
            }
            for f in fns
        ]
    }


def parse(text: str, tools: list[dict]) -> tuple[str | None, list[ToolCall]]:
    """(content left as text, the calls) of a reply: by the first format (tool_formats.FORMATS,
    in order) whose markup holds calls that all name one of the tools with object arguments."""
    params = {f["name"]: f.get("parameters") or {} for f in functions(tools)}
    stripped = text.strip()
    body = tool_formats.json_or_none(stripped.removeprefix("<|python_tag|>"))
    if isinstance(body, dict) and len(body) == 1 and isinstance(body.get("response"), str):
        return body["response"], []  # the generic format's answer in words
    for fmt in tool_formats.FORMATS:
        found = fmt.parse(stripped, params)
        if found is None:
            continue
        rest, raw = found
        calls = [_checked(name, args, cid, params) for name, args, cid in raw]
        if calls and all(calls):
            return (rest.strip() or None), calls  # type: ignore[misc]  # all() saw no None
    return text, []


def _checked(name: Any, args: Any, cid: str, params: dict[str, dict]) -> ToolCall | None:
    """A parsed call as a ToolCall, or None when it names no tool or its arguments are no object."""
    if isinstance(args, str):
        args = tool_formats.json_or_none(args)
    if name in params and isinstance(args, dict):
        return ToolCall(name, args, cid)
    return None
