"""Tool-call markups beyond JSON: the tag formats of DeepSeek, Kimi K2, Phi-4-mini, Qwen3-Coder,
GLM-4.5, MiniMax-M2 and Command R7B replies (as llama.cpp's common/chat parsers list them).

Each parser takes a reply and the tools' parameter schemas and returns (the text outside the
calls, [(name, arguments, id)]) or None when its markup is not there. Formats that spell each
argument as text (`<parameter=city>Paris</parameter>`) are typed by the tool's schema: a string
property keeps the text, any other is read as JSON (and kept as text if it is not JSON). Names are
checked against the request's tools by the caller (tool_calls.parse).
"""

from __future__ import annotations

import json
import re
from typing import Any

Call = tuple[str, Any, str]  # name, arguments, id ("" for one to be made)
Parsed = tuple[str, list[Call]] | None

# the openers of these markups, for the stream (tool_calls.ToolStream): text from one on is held
OPENERS = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜DSML｜",
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
    "<|tool_call|>",
    "<minimax:tool_call>",
    "<|START_ACTION|>",
)

_DEEPSEEK = re.compile(
    r"<｜tool▁call▁begin｜>(?:function<｜tool▁sep｜>(?P<n1>[^\n<]+)\n```(?:json)?\s*(?P<a1>.*?)\s*```"
    r"|(?P<n2>[^<]+?)<｜tool▁sep｜>\s*(?P<a2>.*?))\s*<｜tool▁call▁end｜>",
    re.S,
)
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


def deepseek(text: str, params: dict[str, dict]) -> Parsed:
    """DeepSeek R1 (`function<｜tool▁sep｜>name` and a ```json block) and V3.1 (`name<｜tool▁sep｜>{...}`)."""
    if "<｜tool▁call▁begin｜>" not in text:
        return None
    calls = []
    for m in _DEEPSEEK.finditer(text):
        name = (m.group("n1") or m.group("n2") or "").strip()
        calls.append((name, json_or_none(m.group("a1") if m.group("n1") else m.group("a2")), ""))
    rest = _DEEPSEEK_BLOCK.sub("", text) if "<｜tool▁calls▁begin｜>" in text else _DEEPSEEK.sub("", text)
    return rest, calls


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


PARSERS = (deepseek, dsml, kimi, phi4, qwen_xml, glm, minimax, command_r)
