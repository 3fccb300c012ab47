"""OpenAI's Responses API (`POST /v1/responses`) with the official client, over real sockets on the
default model: text, streaming (the event sequence assembles to the non-streamed text), structured
output through `text.format`, function tools and a conversation carrying a call and its output;
malformed input refused with a 400 that names the field."""

from __future__ import annotations

import json

import jsonschema
import pytest

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import os

    from test_server import start_server

    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path_factory.mktemp("cfg")))
    proc, url, _ = start_server(env, "--draft-kind", "prompt-lookup")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def client(url):
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key="none")


def test_text_and_streaming(server):
    c = client(server)
    r = c.responses.create(
        model="m", input="Repeat exactly: the cat sat on the mat.", max_output_tokens=24, temperature=0
    )
    assert r.status in ("completed", "incomplete") and r.output_text
    assert r.usage.output_tokens > 0 and r.usage.input_tokens > 0
    events, text = [], ""
    with c.responses.stream(
        model="m", input="Repeat exactly: the cat sat on the mat.", max_output_tokens=24, temperature=0
    ) as stream:
        for e in stream:
            events.append(e.type)
            if e.type == "response.output_text.delta":
                text += e.delta
        final = stream.get_final_response()
    assert text == r.output_text == final.output_text
    assert events[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert events[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]


def test_instructions_input_items_and_structured_output(server):
    c = client(server)
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 30}},
        "required": ["name"],
        "additionalProperties": False,
    }
    r = c.responses.create(
        model="m",
        instructions="You answer in JSON.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "My name is Ada. Give my name as JSON."}]}],
        text={"format": {"type": "json_schema", "name": "person", "schema": schema}},
        max_output_tokens=40,
        temperature=0,
    )
    jsonschema.validate(json.loads(r.output_text), schema)


def test_function_tools_and_a_conversation_with_a_call(server):
    c = client(server)
    required = dict(
        model="m",
        input="Weather in Oslo?",
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=60,
        temperature=0,
    )
    r = c.responses.create(**required)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    follow = c.responses.create(
        model="m",
        input=[
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "type": "function_call",
                "call_id": calls[0].call_id,
                "name": "get_weather",
                "arguments": calls[0].arguments,
            },
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temp": 3, "sky": "snow"}'},
        ],
        tools=[WEATHER],
        max_output_tokens=40,
        temperature=0,
    )
    assert follow.output  # a message, or another call
    # streamed with tools: the call arrives with its argument events
    types = []
    with c.responses.stream(**required) as stream:
        for e in stream:
            types.append(e.type)
        final = stream.get_final_response()
    assert "response.function_call_arguments.done" in types and types[-1] == "response.completed"
    assert [o.type for o in final.output] == ["function_call"]


@pytest.mark.parametrize(
    "body,message",
    [
        ({"input": ""}, "'input'"),
        ({"input": [{"type": "image", "url": "x"}]}, "type 'image' is not supported"),
        ({"input": [{"role": "robot", "content": "x"}]}, "role must be one of"),
        ({"input": "x", "previous_response_id": "resp_1"}, "'previous_response_id' is not supported"),
        ({"input": "x", "text": {"format": {"type": "yaml"}}}, "'response_format': type must be"),
        ({"input": "x", "tool_choice": {"type": "mcp"}, "tools": [WEATHER]}, "'tool_choice'"),
    ],
)
def test_malformed_requests_are_400(server, body, message):
    from test_server import post

    status, r = post(server + "/v1/responses", body)
    assert status == 400 and message in r["error"]["message"], r


def test_stream_telemetry_as_llama_server_sends_it(server):
    """llama.cpp's test_responses_stream_with_llama_telemetry, on unprefixed /responses:
    `prompt_progress` on `response.in_progress` events, `timings` on text deltas
    (`timings_per_token`) and on `response.completed` (#52)."""
    from test_server import sse_data

    body = {
        "input": "This is a test" * 10,
        "max_output_tokens": 8,
        "temperature": 0.8,
        "stream": True,
        "timings_per_token": True,
        "return_progress": True,
    }
    events = sse_data(server + "/responses", body)
    progress = [e for e in events if "prompt_progress" in e]
    assert progress and all(e["type"] == "response.in_progress" for e in progress)
    assert all(e["prompt_progress"]["total"] > 0 for e in progress)
    assert all(e["prompt_progress"]["processed"] >= e["prompt_progress"]["cache"] for e in progress)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all({"prompt_per_second", "predicted_per_second"} <= e["timings"].keys() for e in deltas)
    done = [e for e in events if e["type"] == "response.completed"]
    assert len(done) == 1 and "usage" in done[0]["response"] and "timings" in done[0]
    assert done[0]["timings"]["predicted_n"] == done[0]["response"]["usage"]["output_tokens"]
