"""Tool-call formats: one row per format a model writes its calls in, holding how to find it in a
chat template's source, where its calls begin in a reply, how to write one call (for the grammar of
a required or named call) and how to read calls back (as llama.cpp's common/chat and mlx-lm's
`tool_parsers/` list them).

`FORMATS` is in order: the first row whose template marker a chat template holds gives the format a
required call is written in (Hermes when none does), and a reply is read by the first row whose
parser finds calls naming the request's tools. The order matters where markers overlap: DeepSeek
R1's `function<｜tool▁sep｜>` holds V3.1's `<｜tool▁sep｜>`; Qwen3-Coder's and GLM's markups open
with Hermes' `<tool_call>` (their templates get Hermes' writer, their replies fail Hermes' JSON).

Each parser takes a reply and the tools' parameter schemas and returns (the text outside the
calls, [(name, arguments, id)]) or None when its markup is not there. Formats that spell each
argument as text (`<parameter=city>Paris</parameter>`) are typed by the tool's schema: a string
property keeps the text, any other is read as JSON (and kept as text if it is not JSON). Names are
checked against the request's tools by the caller (tool_calls.parse).

Adding a format is one row (and its parser) here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Call = tuple[str, Any, str]  # name, arguments, id ("" for one to be made)
Parsed = tuple[str, list[Call]] | None

_DEEPSEEK_R1 = re.compile(
    r"<｜tool▁call▁begin｜>function<｜tool▁sep｜>([^\n<]+)\n```(?:json)?\s*(.*?)\s*```\s*<｜tool▁call▁end｜>", re.S
)
_DEEPSEEK_V31 = re.compile(r"<｜tool▁call▁begin｜>([^<]+?)<｜tool▁sep｜>\s*(.*?)\s*<｜tool▁call▁end｜>", re.S)
_DEEPSEEK_BLOCK = re.compile(r"<｜tool▁calls▁begin｜>.*?(?:<｜tool▁calls▁end｜>|$)", re.S)
_DSML_BLOCK = re.compile(
    r"<｜DSML｜(?:function_calls|tool_calls)>.*?(?:</｜DSML｜(?:function_calls|tool_calls)>|$)", re.S
)
_DSML_INVOKE = re.compile(r'<｜DSML｜invoke name="([^"]+)">(.*?)</｜DSML｜invoke>', re.S)
_DSML_PARAM = re.compile(r'<｜DSML｜parameter name="([^"]+)" string="(true|false)">(.*?)</｜DSML｜parameter>', re.S)
_KIMI = re.compile(
    r"<\|tool_call_begin\|>\s*(functions\.([\w.-]+):\d+)\s*<\|tool_call_argument_begin\|>\s*(.*?)\s*"
    r"(?:<\|tool_call_end\|>|(?=<\|tool_call_begin\|>)|(?=<\|tool_calls_section_end\|>)|$)",
    re.S,
)
_KIMI_SECTION = re.compile(r"<\|tool_calls_section_begin\|>|<\|tool_calls_section_end\|>")
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_PHI4 = re.compile(r"<\|tool_call\|>\s*(.*?)\s*(?:<\|/tool_call\|>|$)", re.S)
_QWEN_XML = re.compile(r"<tool_call>\s*<function=([^>\s]+)>(.*?)</function>\s*(?:</tool_call>|$)", re.S)
_QWEN_PARAM = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.S)
_GLM = re.compile(r"<tool_call>([^\n<{]*)\n?(.*?)(?:</tool_call>|$)", re.S)  # flat: no nested repeats
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)
_MINIMAX_BLOCK = re.compile(r"<minimax:tool_call>(.*?)(?:</minimax:tool_call>|$)", re.S)
_MINIMAX_INVOKE = re.compile(r'<invoke name="([^"]+)">(.*?)</invoke>', re.S)
_MINIMAX_PARAM = re.compile(r'<parameter name="([^"]+)">\n?(.*?)\n?</parameter>', re.S)
_COMMAND_R = re.compile(r"<\|START_ACTION\|>(.*?)(?:<\|END_ACTION\|>|$)", re.S)


def json_or_none(text: str) -> Any:
    """`text` parsed as JSON, or None where it is not JSON (a reply's calls may be cut off)."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def _typed(value: str, schema: dict | None) -> Any:
    """A text-spelled argument as its schema types it: strings stay text, the rest is JSON."""
    kind = (schema or {}).get("type")
    if kind == "string" or (kind is None and not schema):
        return value
    parsed = json_or_none(value)
    return value if parsed is None and value.strip() not in ("null",) else parsed


def _args(pairs: list[tuple[str, str]], params: dict) -> dict:
    props = params.get("properties", {}) if isinstance(params, dict) else {}
    return {k.strip(): _typed(v, props.get(k.strip())) for k, v in pairs}


def _deepseek(pattern: re.Pattern, text: str) -> Parsed:
    calls = [(m.group(1).strip(), json_or_none(m.group(2)), "") for m in pattern.finditer(text)]
    rest = _DEEPSEEK_BLOCK.sub("", text) if "<｜tool▁calls▁begin｜>" in text else pattern.sub("", text)
    return rest, calls


def deepseek_r1(text: str, params: dict[str, dict]) -> Parsed:
    """DeepSeek R1: `function<｜tool▁sep｜>name` and a ```json block."""
    return _deepseek(_DEEPSEEK_R1, text) if "function<｜tool▁sep｜>" in text else None


def deepseek_v31(text: str, params: dict[str, dict]) -> Parsed:
    """DeepSeek V3.1: `name<｜tool▁sep｜>{...}`."""
    return _deepseek(_DEEPSEEK_V31, text) if "<｜tool▁call▁begin｜>" in text else None


def dsml(text: str, params: dict[str, dict]) -> Parsed:
    """DeepSeek V3.2 / V4: `<｜DSML｜invoke name=...>` with typed `<｜DSML｜parameter>`s."""
    if "<｜DSML｜" not in text:
        return None
    calls = []
    for m in _DSML_INVOKE.finditer(text):
        args = {}
        for k, is_string, v in _DSML_PARAM.findall(m.group(2)):
            args[k] = v if is_string == "true" else json_or_none(v)
        calls.append((m.group(1), args, ""))
    return _DSML_BLOCK.sub("", text), calls


def kimi(text: str, params: dict[str, dict]) -> Parsed:
    """Kimi K2: `<|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{...}`; the
    `functions.name:0` is the call's id."""
    if "<|tool_call_begin|>" not in text:
        return None
    calls = [(m.group(2), json_or_none(m.group(3)), m.group(1)) for m in _KIMI.finditer(text)]
    first = text.find("<|tool_calls_section_begin|>")
    cut = first if first >= 0 else text.find("<|tool_call_begin|>")
    return _KIMI_SECTION.sub("", text[:cut]), calls


def phi4(text: str, params: dict[str, dict]) -> Parsed:
    """Phi-4-mini: `<|tool_call|>{"name", "arguments"}<|/tool_call|>` (or a list of them)."""
    if "<|tool_call|>" not in text:
        return None
    calls = []
    for m in _PHI4.finditer(text):
        body = json_or_none(m.group(1))
        for c in body if isinstance(body, list) else [body]:
            if isinstance(c, dict):
                calls.append((c.get("name"), c.get("arguments", c.get("parameters", {})), ""))
    return _PHI4.sub("", text), calls


def qwen_xml(text: str, params: dict[str, dict]) -> Parsed:
    """Qwen3-Coder: `<tool_call><function=name><parameter=key>value</parameter></function></tool_call>`."""
    if "<function=" not in text:
        return None
    calls = [
        (m.group(1), _args(_QWEN_PARAM.findall(m.group(2)), params.get(m.group(1), {})), "")
        for m in _QWEN_XML.finditer(text)
    ]
    return _QWEN_XML.sub("", text), calls


def glm(text: str, params: dict[str, dict]) -> Parsed:
    """GLM-4.5: `<tool_call>name` then `<arg_key>k</arg_key><arg_value>v</arg_value>` pairs."""
    if "<arg_key>" not in text and not re.search(r"<tool_call>\s*[\w.-]+\s*</tool_call>", text):
        return None
    calls = []
    for m in _GLM.finditer(text):
        name, body = m.group(1).strip(), m.group(2)
        if not name or (body.strip() and "<arg_key>" not in body):
            continue  # not this markup (a Hermes block's JSON, say)
        calls.append((name, _args(_GLM_ARG.findall(body), params.get(name, {})), ""))
    return _GLM.sub("", text), calls


def minimax(text: str, params: dict[str, dict]) -> Parsed:
    """MiniMax-M2: `<minimax:tool_call><invoke name=...><parameter name=...>v</parameter>...`."""
    if "<minimax:tool_call>" not in text:
        return None
    calls = []
    for block in _MINIMAX_BLOCK.findall(text):
        for name, body in _MINIMAX_INVOKE.findall(block):
            calls.append((name, _args(_MINIMAX_PARAM.findall(body), params.get(name, {})), ""))
    return _MINIMAX_BLOCK.sub("", text), calls


def command_r(text: str, params: dict[str, dict]) -> Parsed:
    """Command R7B: `<|START_ACTION|>[{"tool_call_id", "tool_name", "parameters"}]<|END_ACTION|>`."""
    if "<|START_ACTION|>" not in text:
        return None
    calls = []
    for block in _COMMAND_R.findall(text):
        body = json_or_none(block.strip())
        for c in body if isinstance(body, list) else [body]:
            if isinstance(c, dict):
                calls.append((c.get("tool_name"), c.get("parameters", {}), ""))
    return _COMMAND_R.sub("", text), calls


def _json_call(obj: Any) -> Call:
    """A call written as JSON: `name` and `arguments` (Llama 3.x: `parameters`)."""
    if not isinstance(obj, dict):
        return (None, None, "")  # type: ignore[return-value]  # fails the caller's check
    return (obj.get("name"), obj.get("arguments", obj.get("parameters", {})), "")


def hermes(text: str, params: dict[str, dict]) -> Parsed:
    """Hermes / Qwen: `<tool_call>{json}</tool_call>` blocks, possibly several, possibly after some
    text; a block that is not a call of one of the tools stays in the text."""
    if "<tool_call>" not in text:
        return None
    rest, calls = text, []
    for m in _HERMES.finditer(text):
        call = _json_call(json_or_none(m.group(1)))
        args = json_or_none(call[1]) if isinstance(call[1], str) else call[1]
        if call[0] in params and isinstance(args, dict):
            calls.append(call)
            rest = rest.replace(m.group(0), "")
    return rest, calls


def mistral(text: str, params: dict[str, dict]) -> Parsed:
    """Mistral: `[TOOL_CALLS][{"name", "arguments"}, ...]`."""
    if not text.startswith("[TOOL_CALLS]"):
        return None
    body = json_or_none(text[len("[TOOL_CALLS]") :])
    return "", [_json_call(c) for c in body] if isinstance(body, list) else []


def _json_reply(text: str) -> Any:
    return json_or_none(text.removeprefix("<|python_tag|>"))


def generic(text: str, params: dict[str, dict]) -> Parsed:
    """llama.cpp's generic format: `{"tool_call": {...}}` or `{"tool_calls": [...]}` (its plain
    answer, `{"response": "..."}`, is read by tool_calls.parse)."""
    body = _json_reply(text)
    if not isinstance(body, dict):
        return None
    if "tool_call" in body:
        call = _json_call(body["tool_call"])
        if call[0] in params:
            return "", [call]
    if isinstance(body.get("tool_calls"), list):
        return "", [_json_call(c) for c in body["tool_calls"]]
    return None


def llama3(text: str, params: dict[str, dict]) -> Parsed:
    """Llama 3.x: a bare `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`."""
    body = _json_reply(text)
    return ("", [_json_call(body)]) if isinstance(body, dict) else None


@dataclass(frozen=True)
class CallFormat:
    """How a template's model writes one call, for the grammar of a required or named call:
    `open`, the call, `close`; the call is a JSON object holding the name and the arguments under
    `arguments` (in a one-item list when `listed`), or with `named` the name outside the JSON:
    `before(name)`, the arguments object, `after`."""

    name: str
    open: str
    close: str
    arguments: str = "arguments"
    listed: bool = False
    named: tuple[str, str] | None = None  # (text before the arguments, with {name}; text after them)


@dataclass(frozen=True)
class ToolFormat:
    """One format: its parser; in a chat template's source, `template` markers naming it (with
    `writer`, how a required call is written); in a reply, `opens`, markup a call begins with
    anywhere (a stream holds the text from there), and `starts`, how a reply that is wholly a
    call begins."""

    name: str
    parse: Callable[[str, dict[str, dict]], Parsed]
    template: tuple[str, ...] = ()
    writer: CallFormat | None = None
    opens: tuple[str, ...] = ()
    starts: tuple[str, ...] = ()


HERMES_CALL = CallFormat("hermes", "<tool_call>\n", "\n</tool_call>")
_DEEPSEEK_OPENS = ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>")
_KIMI_OPENS = ("<|tool_calls_section_begin|>", "<|tool_call_begin|>")
_LLAMA3_CALL = CallFormat("llama3", "", "", arguments="parameters")
# the named formats' calls: (text before the arguments, with {name}; text after them)
_DEEPSEEK_CALLS = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
_R1_CALL = ("<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n", "\n```<｜tool▁call▁end｜>")
_V31_CALL = ("<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>", "<｜tool▁call▁end｜>")
_KIMI_CALL = ("<|tool_call_begin|>functions.{name}:0<|tool_call_argument_begin|>", "<|tool_call_end|>")

FORMATS = (
    ToolFormat(
        "mistral",
        mistral,
        template=("[TOOL_CALLS]",),
        writer=CallFormat("mistral", "[TOOL_CALLS]", "", listed=True),
        starts=("[TOOL_CALLS]",),
    ),
    ToolFormat(
        "deepseek-r1",
        deepseek_r1,
        template=("function<｜tool▁sep｜>",),
        writer=CallFormat("deepseek-r1", *_DEEPSEEK_CALLS, named=_R1_CALL),
        opens=_DEEPSEEK_OPENS,
    ),
    ToolFormat(
        "deepseek-v3.1",
        deepseek_v31,
        template=("<｜tool▁sep｜>",),
        writer=CallFormat("deepseek-v3.1", *_DEEPSEEK_CALLS, named=_V31_CALL),
        opens=_DEEPSEEK_OPENS,
    ),
    ToolFormat("dsml", dsml, opens=("<｜DSML｜",)),
    ToolFormat(
        "kimi-k2",
        kimi,
        template=("<|tool_call_begin|>",),
        writer=CallFormat("kimi-k2", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", named=_KIMI_CALL),
        opens=_KIMI_OPENS,
    ),
    ToolFormat(
        "phi4",
        phi4,
        template=("<|tool_call|>",),
        writer=CallFormat("phi4", "<|tool_call|>", "<|/tool_call|>"),
        opens=("<|tool_call|>",),
    ),
    ToolFormat("hermes", hermes, template=("<tool_call>",), writer=HERMES_CALL, opens=("<tool_call>",)),
    ToolFormat("qwen3-coder", qwen_xml, opens=("<tool_call>",)),
    ToolFormat("glm", glm, opens=("<tool_call>",)),
    ToolFormat("minimax", minimax, opens=("<minimax:tool_call>",)),
    ToolFormat("command-r", command_r, opens=("<|START_ACTION|>",)),
    ToolFormat("generic", generic, starts=("{",)),
    ToolFormat(
        "llama3", llama3, template=("<|python_tag|>", "ipython"), writer=_LLAMA3_CALL, starts=("<|python_tag|>", "{")
    ),
)


def _unique(items: Any) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


# markup a call begins with anywhere in a reply (text before it streams; from it on, it is held)
OPENERS = _unique(m for f in FORMATS for m in f.opens)
# how a reply that is wholly a call begins (after whitespace): while its start could be one, it is held
CALL_STARTS = _unique((*OPENERS, *(m for f in FORMATS for m in f.starts)))


def call_format(template: str | None) -> CallFormat:
    """The call format a chat template's model writes (Hermes when its source names none)."""
    for fmt in FORMATS:
        if fmt.writer is not None and any(m in (template or "") for m in fmt.template):
            return fmt.writer
    return HERMES_CALL
