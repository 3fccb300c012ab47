"""Tool calls on `/v1/chat/completions` (server/tool_calls.py).

Parsing every format real templates emit; the generic format on the default model (its template
takes no tools), where a required call is decoded under the tool's own schema, tested with the
official openai client, streamed and not; a Hermes-style template on a tiny model, the tools
rendered through the template itself; and 400s for tools that cannot be honoured.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from mlxcel_py.formats.grammars import check
from mlxcel_py.server import tool_calls as tc
from mlxcel_py.server import tool_formats
from mlxcel_py.server.tool_stream import ToolStream

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [WEATHER, TIME]


@pytest.mark.parametrize(
    "text,content,calls",
    [
        ('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', None, [("get_time", {})]),
        (
            'Sure.<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C"}}</tool_call>'
            '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
            "Sure.",
            [("get_weather", {"city": "Oslo", "unit": "C"}), ("get_time", {})],
        ),
        ('[TOOL_CALLS][{"name": "get_time", "arguments": {}}]', None, [("get_time", {})]),
        (
            '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome", "unit": "F"}}',
            None,
            [("get_weather", {"city": "Rome", "unit": "F"})],
        ),
        ('{"tool_call": {"name": "get_time", "arguments": {}}}', None, [("get_time", {})]),
        ('{"response": "It is sunny."}', "It is sunny.", []),
        ('{"name": "launch_rockets", "arguments": {}}', '{"name": "launch_rockets", "arguments": {}}', []),
        ("<tool_call>{not json}</tool_call>", "<tool_call>{not json}</tool_call>", []),
        ("Just text.", "Just text.", []),
        # the tag markups of llama.cpp's other parsers (common/chat*, common/parsers/)
        (
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
            '{"city": "Oslo", "unit": "C"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
            None,
            [("get_weather", {"city": "Oslo", "unit": "C"})],
        ),  # DeepSeek R1
        (
            "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
            '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Rome", "unit": "F"}<｜tool▁call▁end｜>'
            "<｜tool▁calls▁end｜>",
            "Checking.",
            [("get_time", {}), ("get_weather", {"city": "Rome", "unit": "F"})],
        ),  # DeepSeek V3.1
        (
            '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
            '<｜DSML｜parameter name="city" string="true">São Paulo</｜DSML｜parameter>\n'
            '<｜DSML｜parameter name="unit" string="true">C</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
            "</｜DSML｜function_calls>",
            None,
            [("get_weather", {"city": "São Paulo", "unit": "C"})],
        ),  # DeepSeek V3.2
        (
            "Sure. <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
            '<|tool_call_argument_begin|>{"city": "Lima", "unit": "C"}<|tool_call_end|><|tool_calls_section_end|>',
            "Sure.",
            [("get_weather", {"city": "Lima", "unit": "C"})],
        ),  # Kimi K2
        ('<|tool_call|>{"name": "get_time", "arguments": {}}<|/tool_call|>', None, [("get_time", {})]),  # Phi-4-mini
        (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
            "<parameter=unit>\nF\n</parameter>\n</function>\n</tool_call>",
            None,
            [("get_weather", {"city": "New York", "unit": "F"})],
        ),  # Qwen3-Coder
        (
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Cairo</arg_value>\n"
            "<arg_key>unit</arg_key>\n<arg_value>C</arg_value>\n</tool_call>",
            None,
            [("get_weather", {"city": "Cairo", "unit": "C"})],
        ),  # GLM-4.5
        (
            '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Oslo</parameter>\n'
            '<parameter name="unit">C</parameter>\n</invoke>\n</minimax:tool_call>',
            None,
            [("get_weather", {"city": "Oslo", "unit": "C"})],
        ),  # MiniMax-M2
        (
            '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_time", "parameters": {}}]<|END_ACTION|>',
            None,
            [("get_time", {})],
        ),  # Command R7B
        (
            '<|tool_call|>{"name": "format_disk", "arguments": {}}<|/tool_call|>',
            '<|tool_call|>{"name": "format_disk", "arguments": {}}<|/tool_call|>',
            [],
        ),  # a name that is no tool stays text, in every markup
    ],
)
def test_parse_the_formats_templates_emit(text, content, calls):
    got_content, got = tc.parse(text, TOOLS)
    assert got_content == content
    assert [(c.name, c.arguments) for c in got] == calls


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("choice", ["required", "auto", {"type": "function", "function": {"name": "get_weather"}}])
def test_constraints_compile(native, choice):
    spec = tc.constraint(TOOLS, choice, native=native)
    if native and choice == "auto":
        assert spec is None  # free text: the model decides
    else:
        check(spec)


def _server(cli_env, *args):
    from test_server import start_server

    return start_server(cli_env, *args)


def test_generic_format_on_the_default_model_with_the_openai_client(cli_env):
    from openai import OpenAI

    proc, url, _ = _server(cli_env, "--draft-kind", "prompt-lookup")
    try:
        client = OpenAI(base_url=url + "/v1", api_key="none")
        messages = [{"role": "user", "content": "What is the weather in Paris, in Celsius?"}]
        r = client.chat.completions.create(
            model="m", messages=messages, tools=TOOLS, tool_choice="required", max_tokens=80, temperature=0
        )
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.id and call.function.name in ("get_weather", "get_time")
        args = json.loads(call.function.arguments)
        params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
        jsonschema.validate(args, params[call.function.name])
        # a named function: that one, with its arguments' schema
        named = client.chat.completions.create(
            model="m",
            messages=messages,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=80,
            temperature=0,
        )
        wcall = named.choices[0].message.tool_calls[0]
        assert wcall.function.name == "get_weather"
        jsonschema.validate(json.loads(wcall.function.arguments), WEATHER["function"]["parameters"])
        # streamed: the deltas assemble to the same call
        stream = client.chat.completions.create(
            model="m",
            messages=messages,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=80,
            temperature=0,
            stream=True,
        )
        name, arguments, finish, pieces = "", "", None, []
        for chunk in stream:
            if not chunk.choices:
                continue
            for d in chunk.choices[0].delta.tool_calls or []:
                pieces.append(d)
                name += d.function.name or ""
                arguments += d.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        # OpenAI's pieces: the id and name first, then the arguments in fragments
        assert pieces[0].id and pieces[0].function.name == "get_weather" and len(pieces) > 2
        assert all(p.id is None and p.index == 0 for p in pieces[1:])
        assert (name, json.loads(arguments), finish) == (
            "get_weather",
            json.loads(wcall.function.arguments),
            "tool_calls",
        )
        # the call and its result go back into the history; the model answers (or calls again)
        follow = client.chat.completions.create(
            model="m",
            messages=messages
            + [
                {"role": "assistant", "content": None, "tool_calls": [wcall.model_dump()]},
                {"role": "tool", "tool_call_id": wcall.id, "content": '{"temp": 21, "sky": "clear"}'},
            ],
            tools=TOOLS,
            max_tokens=60,
            temperature=0,
        )
        msg = follow.choices[0].message
        assert msg.content or msg.tool_calls
        # tool_choice none: plain text, no constraint
        plain = client.chat.completions.create(
            model="m", messages=messages, tools=TOOLS, tool_choice="none", max_tokens=20, temperature=0
        )
        assert plain.choices[0].message.tool_calls is None and plain.choices[0].message.content
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize(
    "extra,message",
    [
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]},
            "'tools.0.function.parameters': the JSON schema does not compile",
        ),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "'tools.0.function.name'"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "'tool_choice' names nope, which is not one of the tools",
        ),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "'tool_choice'"),
        ({"tool_choice": "required"}, "'tool_choice' needs 'tools'"),
        ({"tools": [WEATHER, TIME, WEATHER]}, "'tools': function names must be unique; get_weather appears"),
        (
            {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
            "'tools' and 'response_format' both constrain the reply",
        ),
    ],
)
def test_tools_that_cannot_be_honoured_are_400(extra, message):
    from test_server_requests import make_client  # the HTTP layer over a fake worker

    client, _ = make_client()
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], **extra})
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"], r.json()


HERMES = (
    "{%- if tools %}<|im_start|>system\nTools:\n{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}\n"
    "Call one as <tool_call>{json}</tool_call><|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.tool_calls %}{%- for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{%- endfor %}"
    "{%- else %}{{ m.content }}{%- endif %}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def _with_template(model: Path, folder: Path, template: str) -> Path:
    """A copy of `model` whose tokenizer carries `template` as its chat template."""
    import shutil

    shutil.copytree(model, folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


def test_a_template_that_takes_tools_renders_them_and_a_required_call_parses(tiny_dir, tmp_path):

    from mlxcel_py.models import loading
    from mlxcel_py.options import SamplingOptions
    from mlxcel_py.server import schemas
    from mlxcel_py.server.requests import RequestReader

    d = _with_template(tiny_dir, tmp_path / "hermes", HERMES)
    tok = loading.load_tokenizer_only(loading.resolve(str(d)))
    assert tc.template_takes_tools(tok)
    reader = RequestReader(tok, 260, 2048, SamplingOptions(), -1)
    req = schemas.ChatRequest.model_validate(
        {"messages": [{"role": "user", "content": "weather?"}], "tools": [WEATHER], "tool_choice": "required"}
    )
    text = tok.decode(reader.chat_prompt(req.messages, req.tools))
    assert '"name": "get_weather"' in text and text.endswith("<|im_start|>assistant")
    _, spec = reader.tools(req)
    assert spec.kind == "lark"
    # decoding under it on the tiny model (random weights) still yields a well-formed call
    from mlxcel_py.engine.engine import Engine
    from mlxcel_py.engine.grammar import TokenizerIndex

    loaded = loading.load(loading.resolve(str(d)))
    eng = Engine(loaded.model, eos_ids=tok.eos_token_ids, vocab_size=loaded.vocab_size, context_length=2048)
    constraint = TokenizerIndex.of(loaded.tokenizer, loaded.vocab_size, tok.eos_token_ids).compile(spec)
    out = [
        e.token
        for e in eng.generate(reader.chat_prompt(req.messages, req.tools), max_tokens=200, constraint=constraint)
    ]
    content, calls = tc.parse(tok.decode(out), [WEATHER])
    assert calls and calls[0].name == "get_weather"
    jsonschema.validate(calls[0].arguments, WEATHER["function"]["parameters"])


def test_anthropic_tool_use_with_the_official_client(cli_env):
    """/v1/messages with tools: a tool_use block whose input fits the schema, stop_reason
    tool_use, the same streamed, and a tool_result turn back."""
    import anthropic

    proc, url, _ = _server(cli_env, "--draft-kind", "prompt-lookup")
    try:
        client = anthropic.Anthropic(base_url=url, api_key="none")
        weather = {
            "name": "get_weather",
            "description": "The weather in a city",
            "input_schema": WEATHER["function"]["parameters"],
        }
        msgs = [{"role": "user", "content": "What is the weather in Paris, in Celsius?"}]
        m = client.messages.create(
            model="local",
            max_tokens=80,
            messages=msgs,
            tools=[weather],
            tool_choice={"type": "any"},
            extra_body={"temperature": 0},
        )
        assert m.stop_reason == "tool_use"
        use = next(b for b in m.content if b.type == "tool_use")
        assert use.name == "get_weather" and use.id.startswith("toolu_")
        jsonschema.validate(use.input, weather["input_schema"])
        with client.messages.stream(
            model="local",
            max_tokens=80,
            messages=msgs,
            tools=[weather],
            tool_choice={"type": "tool", "name": "get_weather"},
            extra_body={"temperature": 0},
        ) as s:
            final = s.get_final_message()
        suse = next(b for b in final.content if b.type == "tool_use")
        assert final.stop_reason == "tool_use" and suse.input == use.input
        follow = client.messages.create(
            model="local",
            max_tokens=40,
            messages=msgs
            + [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}],
                },
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21 C, clear"}]},
            ],
            tools=[weather],
            extra_body={"temperature": 0},
        )
        assert follow.content
        n = client.messages.count_tokens(model="local", messages=msgs, tools=[weather])
        assert n.input_tokens > client.messages.count_tokens(model="local", messages=msgs).input_tokens
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_live_arguments_follow_strings_escapes_and_nesting_and_several_calls():
    text = (
        'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris {x}", "n": [1, {"a": 2}]}}'
        '\n</tool_call><tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    )
    stream = ToolStream([WEATHER], live_args=True)
    content, entries = "", []
    for at in range(0, len(text), 3):  # three characters at a time
        c, e = stream.feed(text[at : at + 3])
        content, entries = content + c, entries + e
    rest, calls, late = stream.finish()
    assert content == "Sure. " and rest is None and late == [] and len(calls) == 2
    for i, call in enumerate(calls):
        mine = [e for e in entries if e["index"] == i]
        assert mine[0]["function"] == {"name": "get_weather", "arguments": ""} and mine[0]["id"]
        assert json.loads("".join(e["function"]["arguments"] for e in mine)) == call.arguments
    # without a grammar nothing goes out before the end, and then the calls go out whole
    stream = ToolStream([WEATHER])
    assert [stream.feed(text[at : at + 3])[1] for at in range(0, len(text), 3)] == [[]] * len(range(0, len(text), 3))
    rest, calls, late = stream.finish()
    assert len(calls) == 2 and {e["index"] for e in late} == {0, 1}
    # a name that is no tool stops the live path instead of sending a call that is not one
    stream = ToolStream([WEATHER], live_args=True)
    assert stream.feed('{"name": "rm_rf", "arguments": {"path": "/"}}')[1] == []


def test_text_spelled_arguments_are_typed_by_the_schema_and_kimi_ids_are_kept():
    count = {
        "type": "function",
        "function": {
            "name": "count",
            "parameters": {
                "type": "object",
                "properties": {
                    "n": {"type": "integer"},
                    "tags": {"type": "array"},
                    "label": {"type": "string"},
                    "x": {"type": "number"},
                },
            },
        },
    }
    _, calls = tc.parse(
        '<tool_call>\n<function=count>\n<parameter=n>\n42\n</parameter>\n<parameter=tags>\n["a", 1]\n'
        "</parameter>\n<parameter=label>\n007\n</parameter>\n<parameter=x>\nnot a number\n</parameter>\n"
        "</function>\n</tool_call>",
        [count],
    )
    assert calls[0].arguments == {"n": 42, "tags": ["a", 1], "label": "007", "x": "not a number"}
    _, calls = tc.parse("<|tool_call_begin|>functions.get_time:3<|tool_call_argument_begin|>{}<|tool_call_end|>", TOOLS)
    assert calls[0].as_openai()["id"] == "functions.get_time:3"  # llama.cpp keeps Kimi's own id


def test_a_stream_holds_text_from_any_markup_and_sends_the_text_before_it():
    text = 'Let me look. <|tool_call|>{"name": "get_time", "arguments": {}}<|/tool_call|>'
    stream = ToolStream(TOOLS)
    sent = "".join(stream.feed(text[at : at + 2])[0] for at in range(0, len(text), 2))
    rest, calls, late = stream.finish()
    assert sent == "Let me look. " and rest is None and [c.name for c in calls] == ["get_time"]
    assert late[0]["function"]["name"] == "get_time"


@pytest.mark.parametrize(
    "marker,name",
    [
        ("[TOOL_CALLS]", "mistral"),
        ("<|tool_call|>", "phi4"),
        ("function<｜tool▁sep｜>", "deepseek-r1"),
        ("<｜tool▁sep｜>", "deepseek-v3.1"),
        ("<|tool_call_begin|>", "kimi-k2"),
        ("<tool_call>", "hermes"),
        ("<|python_tag|>", "llama3"),
        ("message.role == 'ipython'", "llama3"),
        ("", "hermes"),
    ],
)
def test_the_call_format_follows_the_template_source(marker, name):
    assert tool_formats.call_format("{% for m in messages %}{{ m.content }}{% endfor %}" + marker).name == name


def test_special_tokens_enter_a_lark_grammar_as_tokens_and_text_as_strings():
    special = frozenset({"<|python_tag|>", "<|eot_id|>"})
    assert tc.lark_text('<|python_tag|>{"a"', special) == '<|python_tag|> "{\\"a\\""'
    assert tc.lark_text("plain\n", special) == '"plain\\n"'
    assert tc.lark_text("x<|eot_id|>", special) == '"x" <|eot_id|>'


def test_a_required_call_is_decoded_in_each_templates_own_format(tiny_dir, tmp_path):
    """On the tiny model (random weights), a required call under each format's grammar parses
    back into a call of the right tool whose arguments match its schema."""
    from mlxcel_py.engine.engine import Engine
    from mlxcel_py.engine.grammar import TokenizerIndex
    from mlxcel_py.models import loading
    from mlxcel_py.options import SamplingOptions
    from mlxcel_py.server import schemas
    from mlxcel_py.server.requests import RequestReader

    loaded = loading.load(loading.resolve(str(tiny_dir)))
    tok = loaded.tokenizer
    inner = getattr(tok, "_tokenizer", tok)
    eng = Engine(loaded.model, eos_ids=tok.eos_token_ids, vocab_size=loaded.vocab_size, context_length=2048)
    req = schemas.ChatRequest.model_validate(
        {"messages": [{"role": "user", "content": "weather?"}], "tools": [WEATHER, TIME], "tool_choice": "required"}
    )
    seen = set()
    markers = [m for f in tool_formats.FORMATS if f.writer is not None for m in f.template]
    for marker in markers:
        inner.chat_template = (
            "{%- for t in tools %}{{ t | tojson }}{% endfor %}{#- " + marker + " #}"
            "{%- for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant: "
        )
        fmt = tool_formats.call_format(inner.chat_template)
        if fmt.name in seen:
            continue
        seen.add(fmt.name)
        reader = RequestReader(tok, loaded.vocab_size, 2048, SamplingOptions(), -1)
        _, spec = reader.tools(req)
        assert spec.kind == "lark", fmt.name
        constraint = TokenizerIndex.of(loaded.tokenizer, loaded.vocab_size, tok.eos_token_ids).compile(spec)
        ids = reader.chat_prompt(req.messages, req.tools)
        out = [e.token for e in eng.generate(ids, max_tokens=300, constraint=constraint)]
        text = tok.decode(out)
        _, calls = tc.parse(text, [WEATHER, TIME])
        assert len(calls) == 1, (fmt.name, text)
        params = {t["function"]["name"]: t["function"]["parameters"] for t in [WEATHER, TIME]}
        jsonschema.validate(calls[0].arguments, params[calls[0].name])
    assert len(seen) == 7


def test_tag_markups_parse_long_and_cut_off_calls_without_backtracking_blowups():
    # a reply cut off by max_tokens inside a call with many arguments (a nested-repeat regex took
    # seconds at 20 pairs and doubled per pair)
    pairs = "".join(f"<arg_key>k{i}</arg_key>\n<arg_value>{i}</arg_value>\n" for i in range(40))
    params = {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(40)}}
    tool = {"type": "function", "function": {"name": "many", "parameters": params}}
    _, calls = tc.parse("<tool_call>many\n" + pairs, [tool])  # unclosed
    assert calls and calls[0].arguments == {f"k{i}": i for i in range(40)}
    _, calls = tc.parse("<tool_call>many\n" + pairs + "</tool_call>", [tool])
    assert calls and len(calls[0].arguments) == 40


NAMED_RESULTS = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'tool' %}{%- if m.name is not defined %}"
    "{{ raise_exception('Tool response dicts require a name key') }}{%- endif %}"
    "<tool_response>{{ m.name }}: {{ m.content }}</tool_response>"
    "{%- elif m.tool_calls %}{%- for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{%- endfor %}"
    "{%- else %}{{ m.content }}{%- endif %}<|im_end|>\n{%- endfor %}"
    "{%- if tools %}<tools>{{ tools | tojson }}</tools>{%- endif %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def test_tool_results_are_named_after_their_calls_and_a_template_refusal_is_a_400(tiny_dir, tmp_path):
    """Real Hermes-style templates refuse a tool result without `name` (OpenAI's tool turns carry
    only the call's id): the result is named after its call, by id, else in call order; and a
    template's raise_exception is the request's fault, a 400 in its words (it was a 500)."""

    from mlxcel_py.models import loading
    from mlxcel_py.options import SamplingOptions
    from mlxcel_py.server import schemas
    from mlxcel_py.server.http import ApiError
    from mlxcel_py.server.requests import RequestReader

    tok = loading.load_tokenizer_only(loading.resolve(str(_with_template(tiny_dir, tmp_path / "named", NAMED_RESULTS))))
    reader = RequestReader(tok, 260, 2048, SamplingOptions(), -1)
    call = lambda cid, name: {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}  # noqa: E731
    history = [
        {"role": "user", "content": "weather and time?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("call_a", "get_weather"), call("call_b", "get_time")],
        },
        {"role": "tool", "tool_call_id": "call_b", "content": "noon"},  # by id, out of order
        {"role": "tool", "content": "rain"},  # no id: the call not yet answered
    ]
    req = schemas.ChatRequest.model_validate({"messages": history, "tools": [WEATHER]})
    text = tok.decode(reader.chat_prompt(req.messages, req.tools))
    assert "<tool_response>get_time: noon</tool_response>" in text
    assert "<tool_response>get_weather: rain</tool_response>" in text
    named = dict(history[3], name="get_forecast")  # a name the client gives is kept
    req = schemas.ChatRequest.model_validate({"messages": history[:3] + [named], "tools": [WEATHER]})
    assert "<tool_response>get_forecast: rain</tool_response>" in tok.decode(
        reader.chat_prompt(req.messages, req.tools)
    )
    # a result no call explains: the template refuses, and that is a 400 naming its reason
    req = schemas.ChatRequest.model_validate(
        {"messages": [history[0], {"role": "tool", "content": "rain"}], "tools": [WEATHER]}
    )
    with pytest.raises(ApiError, match="the chat template cannot render these messages: Tool response dicts") as e:
        reader.chat_prompt(req.messages, req.tools)
    assert e.value.status == 400


def test_tool_schemas_are_closed_to_keys_they_do_not_list():
    """A required call's grammar closes objects that list their properties (llama.cpp's reading):
    the default model under an open schema kept adding keys until max_tokens cut the call."""
    params = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
            "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}}},
            "extra": {"type": "object", "properties": {}, "additionalProperties": {"type": "string"}},
            "properties": {"anyOf": [{"type": "object", "properties": {"x": {"type": "integer"}}}, {"type": "null"}]},
        },
    }
    out = tc.closed(params)
    assert out["additionalProperties"] is False
    props = out["properties"]
    assert props["where"]["additionalProperties"] is False
    assert props["tags"]["items"]["additionalProperties"] is False
    assert props["extra"]["additionalProperties"] == {"type": "string"}  # said otherwise: kept
    assert props["properties"]["anyOf"][0]["additionalProperties"] is False  # a property named "properties"
    assert "additionalProperties" not in props["properties"]  # ...is a schema, not a mapping
    assert "additionalProperties" not in params  # the request's own schema is left as it was
    # composition: allOf members close nothing (their union would become impossible), and an
    # object composed at its own level may take keys from elsewhere
    both = {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}
    assert tc.closed(both) == both
    mixed = {"type": "object", "properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}]}
    assert tc.closed(mixed) == mixed
    jsonschema.validate({"a": 1, "b": 2}, tc.closed({"type": "object", "properties": {"x": both}})["properties"]["x"])
    fn = dict(
        WEATHER["function"],
        parameters={k: v for k, v in WEATHER["function"]["parameters"].items() if k != "additionalProperties"},
    )
    for native in (True, False):
        spec = tc.constraint([{"type": "function", "function": fn}], "required", native=native)
        schema = json.loads(spec.text.split("%json", 1)[1]) if native else json.loads(spec.text)
        call = schema["anyOf"][0] if native else schema["anyOf"][0]["properties"]["tool_call"]["anyOf"][0]
        assert call["properties"]["arguments"]["additionalProperties"] is False, native


OPENS_THINK = (  # the generation prompt opens a think block, as DeepSeek R1's and Qwen3's do
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{%- endif %}"
)


def test_a_required_call_after_a_template_opened_think_block_is_the_call(tiny_dir, tmp_path, cli_env):
    """A template that opens <think> before the reply (R1 distills, checked one-off on llama.cpp's
    own R1 template): a required call's grammar makes the reply the call, so it is returned as the
    call, not swallowed into reasoning_content (it came back as no call and empty content)."""
    import httpx

    tpl = tmp_path / "think.jinja"
    tpl.write_text(OPENS_THINK)
    proc, url, _ = _server(cli_env, "-m", str(tiny_dir), "--chat-template-file", str(tpl))
    try:
        body = {
            "messages": [{"role": "user", "content": "weather?"}],
            "tools": [WEATHER],
            "tool_choice": "required",
            "max_tokens": 200,
            "temperature": 0,
        }
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()
        msg = r["choices"][0]["message"]
        assert r["choices"][0]["finish_reason"] == "tool_calls", r
        assert msg["tool_calls"][0]["function"]["name"] == "get_weather" and not msg.get("reasoning_content"), msg
        # unconstrained, the same template's open block is still a thought
        body.pop("tools"), body.pop("tool_choice")
        r = httpx.post(url + "/v1/chat/completions", json=dict(body, max_tokens=8), timeout=120).json()
        assert r["choices"][0]["message"].get("reasoning_content"), r
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_special_token_markers_are_decoded_as_single_tokens(tmp_path):
    """A tokenizer whose call markers are special tokens (Phi-4-mini's <|tool_call|>, DeepSeek's
    <｜tool▁calls▁begin｜>...): a required call's grammar names them as tokens, so each marker is
    one token id in the reply (spelled out byte by byte it would not be the model's marker), and
    the reply parses back into the call."""
    from conftest import make_tiny_model
    from tokenizers import Tokenizer

    from mlxcel_py.engine.engine import Engine
    from mlxcel_py.engine.grammar import TokenizerIndex
    from mlxcel_py.models import loading
    from mlxcel_py.options import SamplingOptions
    from mlxcel_py.server import schemas
    from mlxcel_py.server.requests import RequestReader

    d = make_tiny_model(tmp_path / "special", seed=1, scale=2.5, vocab=272)
    markers = ["<|tool_call|>", "<|/tool_call|>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>"]
    markers += ["<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"]
    raw = Tokenizer.from_file(str(d / "tokenizer.json"))
    raw.add_special_tokens(markers)
    raw.save(str(d / "tokenizer.json"))
    loaded = loading.load(loading.resolve(str(d)))
    tok = loaded.tokenizer
    inner = getattr(tok, "_tokenizer", tok)
    assert set(markers) <= tc.special_tokens(tok)
    eng = Engine(loaded.model, eos_ids=tok.eos_token_ids, vocab_size=loaded.vocab_size, context_length=2048)
    req = schemas.ChatRequest.model_validate(
        {"messages": [{"role": "user", "content": "weather?"}], "tools": [WEATHER], "tool_choice": "required"}
    )
    for marker, opener in (("<|tool_call|>", "<|tool_call|>"), ("<｜tool▁sep｜>", "<｜tool▁calls▁begin｜>")):
        inner.chat_template = (
            "{%- for t in tools %}{{ t | tojson }}{% endfor %}{#- " + marker + " #}"
            "{%- for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant: "
        )
        reader = RequestReader(tok, loaded.vocab_size, 2048, SamplingOptions(), -1)
        _, spec = reader.tools(req)
        constraint = TokenizerIndex.of(tok, loaded.vocab_size, tok.eos_token_ids).compile(spec)
        out = [
            e.token
            for e in eng.generate(reader.chat_prompt(req.messages, req.tools), max_tokens=300, constraint=constraint)
        ]
        assert out[0] == inner.convert_tokens_to_ids(opener), (marker, out[:3])
        special_ids = {inner.convert_tokens_to_ids(m) for m in markers}
        text = "".join(tok.decode([t]) for t in out)  # the reply as the server reads it, markers kept
        assert sum(t in special_ids for t in out) == sum(text.count(m) for m in markers) >= 2, (marker, text)
        _, calls = tc.parse(text, [WEATHER])
        assert len(calls) == 1 and calls[0].name == "get_weather", (marker, text)


def _written(writer, name: str, args: dict) -> str:
    """One call as a format's writer lays it out (what its grammar makes a model emit)."""
    body = json.dumps(args)
    if writer.named is not None:
        before, after = writer.named
        call = before.format(name=name) + body + after
    else:
        obj = json.dumps({"name": name, writer.arguments: args})
        call = f"[{obj}]" if writer.listed else obj
    return writer.open + call + writer.close


@pytest.mark.parametrize("fmt", [f for f in tool_formats.FORMATS if f.writer is not None], ids=lambda f: f.name)
def test_each_formats_writer_reads_back_through_the_table(fmt):
    """A call laid out by a row's writer parses back into that call, by that row's own parser
    (a writer and a parser that disagree would make a required call unreadable)."""
    text = _written(fmt.writer, "get_weather", {"city": "Paris"})
    params = {"get_weather": WEATHER["function"]["parameters"]}
    rest, raw = fmt.parse(text, params)
    assert [(n, a if isinstance(a, dict) else json.loads(a)) for n, a, _ in raw] == [("get_weather", {"city": "Paris"})]
    content, calls = tc.parse(text, [WEATHER, TIME])
    assert content is None and [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]
    # while streaming, the call's start is held back rather than sent as text
    assert text.lstrip().startswith(tool_formats.CALL_STARTS)


def test_every_parser_leaves_plain_text_alone():
    for fmt in tool_formats.FORMATS:
        assert fmt.parse("It is sunny in Paris today.", {"get_weather": {}}) is None, fmt.name
    assert tc.parse("It is sunny in Paris today.", [WEATHER]) == ("It is sunny in Paris today.", [])
