"""Tool calls on the chat route: the tools into the prompt, the reply back into `tool_calls`.

Rendering. A chat template that takes tools (its source uses `tools`: Qwen, Hermes, Llama 3.x,
Mistral...) gets them through transformers' `apply_chat_template(tools=...)`, with assistant
`tool_calls` and `tool` messages of the history passed as the template expects them. A template
that does not (the default model's) gets llama.cpp's generic format instead: a system message
that lists the tools as JSON and asks for `{"tool_call": {"name": ..., "arguments": {...}}}` or
`{"response": "..."}`; earlier calls and results are rendered back in that JSON.

Parsing the reply, in the formats real templates make models emit (llama.cpp's common/chat lists
them): Hermes / Qwen `<tool_call>{json}</tool_call>` blocks, Mistral `[TOOL_CALLS][{...}]`,
Llama 3.x bare `{"name": ..., "parameters": {...}}` (optionally after `<|python_tag|>`), and the
generic JSON. A call whose name is not one of the request's tools, or whose JSON does not parse, is
left as text.

Constraint. `tool_choice: "required"` or a named function, and the generic format whenever tools
are offered, constrain decoding to a well-formed reply (grammars.GrammarSpec: a JSON schema for the
generic format, a Lark grammar embedding the arguments' schema for Hermes-style templates), so even
a small model returns a call whose arguments match the tool's parameters.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from ..formats.grammars import GrammarSpec

GENERIC_PROMPT = (
    "You can call these tools (JSON schemas of their arguments):\n{tools}\n\n"
    'Reply with JSON only: {{"tool_call": {{"name": "<tool name>", "arguments": {{...}}}}}} to call a tool, '
    'or {{"response": "<your answer>"}} to answer directly.'
)
# compact JSON in calls: a model's whitespace between tokens could otherwise run on to max_tokens
COMPACT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


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
    template = getattr(tokenizer, "chat_template", None)
    if template is None:
        template = getattr(getattr(tokenizer, "_tokenizer", None), "chat_template", None)
    if isinstance(template, dict):  # named templates: the default one, or any
        template = template.get("default") or next(iter(template.values()), "")
    return isinstance(template, str) and "tools" in template


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
            result = {"tool_response": {"id": t.get("tool_call_id") or "", "content": t.get("content") or ""}}
            out.append({"role": "tool", "content": json.dumps(result, ensure_ascii=False)})
        else:
            out.append({"role": t["role"], "content": t.get("content") or ""})
    system = generic_system(tools)
    if out and out[0]["role"] == "system":
        out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + system}
    else:
        out.insert(0, {"role": "system", "content": system})
    return out


def native_turns(turns: list[dict]) -> list[dict]:
    """History turns for a template that takes tools: arguments as objects, as HF templates read them."""
    out = []
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


def constraint(tools: list[dict], choice: Any, *, native: bool) -> GrammarSpec | None:
    """The grammar a reply must follow: None (free text) unless a call is required, or the
    generic format is in use (its reply is JSON by construction)."""
    fns = functions(tools)
    if isinstance(choice, dict):
        wanted = choice.get("function", {}).get("name")
        fns = [f for f in fns if f["name"] == wanted]
        required = True
    else:
        required = choice == "required"
    if choice == "none":
        return None
    call = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": f["name"]}, "arguments": f.get("parameters") or {"type": "object"}},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for f in fns
        ]
    }
    if not native:
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
    call = {"x-guidance": COMPACT, **call}
    return GrammarSpec("lark", f'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: %json {json.dumps(call)}\n')


def parse(text: str, tools: list[dict]) -> tuple[str | None, list[ToolCall]]:
    """(content left as text, the calls) of a reply."""
    names = {f["name"] for f in functions(tools)}
    stripped = text.strip()
    calls: list[ToolCall] = []

    def take(obj: Any) -> bool:
        if not isinstance(obj, dict):
            return False
        name = obj.get("name")
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return False
        if name in names and isinstance(args, dict):
            calls.append(ToolCall(name, args))
            return True
        return False

    # Hermes / Qwen: <tool_call>{...}</tool_call>, possibly several, possibly after some text
    if "<tool_call>" in stripped:
        rest = stripped
        for m in _HERMES.finditer(stripped):
            if take(_json(m.group(1))):
                rest = rest.replace(m.group(0), "")
        if calls:
            return (rest.strip() or None), calls
    # Mistral: [TOOL_CALLS][{...}, ...]
    if stripped.startswith("[TOOL_CALLS]"):
        body = _json(stripped[len("[TOOL_CALLS]") :])
        if isinstance(body, list) and all(take(c) for c in body) and calls:
            return None, calls
        calls.clear()
    body = _json(stripped.removeprefix("<|python_tag|>"))
    if isinstance(body, dict):
        if "tool_call" in body and take(body["tool_call"]):  # generic
            return None, calls
        if "tool_calls" in body and isinstance(body["tool_calls"], list):
            if all(take(c) for c in body["tool_calls"]) and calls:
                return None, calls
            calls.clear()
        if "response" in body and isinstance(body["response"], str) and len(body) == 1:
            return body["response"], []
        if take(body):  # Llama 3.x: {"name": ..., "parameters": {...}}
            return None, calls
    return text, []


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


# how a reply that is a call begins (after whitespace): while its start could still be one of
# these, or a JSON object (Llama 3.x, the generic format), the text is held back
_CALL_STARTS = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "{")
_HERMES_OPEN = "<tool_call>"
ARGUMENT_FRAGMENT = 24  # characters of a call's arguments per streamed delta


class ToolStream:
    """A streamed reply with tools offered: text that cannot be (part of) a call goes out as it
    comes; from the first sign of a call the rest is held, and parsed when the reply ends."""

    def __init__(self, tools: list[dict]):
        self.tools = tools
        self.head = ""  # the reply's start, while it could still open a call
        self.live = False  # the start was plain text: stream, watching for a Hermes block
        self.held = ""  # from a call's first sign to the end

    def feed(self, text: str) -> str:
        """Content to send now."""
        if self.held and not (self.live and not self.held.startswith(_HERMES_OPEN)):
            self.held += text  # a call has begun: the rest waits for the end
            return ""
        if self.held:  # a live tail that might have begun "<tool_call>": look again with more text
            text, self.held = self.held + text, ""
        if not self.live:
            self.head += text
            start = self.head.lstrip()
            if not start or any(m.startswith(start) or start.startswith(m) for m in _CALL_STARTS):
                if start.startswith(_CALL_STARTS):
                    self.held, self.head = self.head, ""
                return ""
            self.live, text, self.head = True, self.head, ""
        cut = text.find(_HERMES_OPEN)
        if cut >= 0:
            self.held = text[cut:]
            return text[:cut]
        # hold a tail that may be the start of "<tool_call>"
        for k in range(min(len(_HERMES_OPEN) - 1, len(text)), 0, -1):
            if _HERMES_OPEN.startswith(text[-k:]):
                self.held = text[-k:]
                return text[:-k]
        return text

    def finish(self) -> tuple[str | None, list[ToolCall]]:
        """(content still to send, the calls) once the reply is complete."""
        rest = self.head + self.held
        if not rest:
            return None, []
        if not rest.lstrip().startswith(_CALL_STARTS):
            return rest, []
        content, calls = parse(rest, self.tools)
        return content, calls


def call_deltas(calls: list[ToolCall]) -> list[dict]:
    """OpenAI's streamed `delta.tool_calls` for complete calls: per call its id, type and name
    (arguments ""), then its arguments in fragments that concatenate to the whole JSON."""
    out = []
    for i, call in enumerate(calls):
        whole = call.as_openai()
        args = whole["function"]["arguments"]
        out.append(
            {"index": i, "id": whole["id"], "type": "function", "function": {"name": call.name, "arguments": ""}}
        )
        for at in range(0, len(args), ARGUMENT_FRAGMENT):
            out.append({"index": i, "function": {"arguments": args[at : at + ARGUMENT_FRAGMENT]}})
    return out
