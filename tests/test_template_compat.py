"""llama-server's template behaviour (#52): Jinja loop controls, today's date, `add_generation_prompt`,
`--reasoning on|off|auto`, `chat_template_kwargs`, reasoning kept in the history; and the smaller
llama-server / Anthropic / Responses shapes (`/props`, `generation_settings`, `--no-webui`, cache
counters, unprefixed `/responses`). Rendering goes through a real tokenizer (the tiny model's) and
the real app; the worker is the fake one of test_server_requests (it records each job's prompt)."""

from __future__ import annotations

import datetime
import json
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient
from test_server_requests import FakeWorker, make_client

from mlxcel_py.errors import UsageError
from mlxcel_py.formats import chat_templates, template_vars
from mlxcel_py.formats.prompting import render_messages
from mlxcel_py.models import loading
from mlxcel_py.options import SamplingOptions, ServerOptions
from mlxcel_py.server.app import create_app

# what llama.cpp's own template tests expect at the end of the prompt, on templates written here
# in the shape of the real ones (the real files are not copied into this repository)
R1_STYLE = (
    "{% for m in messages %}<｜{{ m.role }}｜>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}"
)
QWEN3_STYLE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
R7B_STYLE = (
    "{% for m in messages %}{% if loop.index > 50 %}{% break %}{% endif %}"
    "<|START_OF_TURN_TOKEN|>{{ m.role }}{{ m.content }}<|END_OF_TURN_TOKEN|>{% endfor %}"
    "{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}"
    "{# <|START_THINKING|> marks its reasoning #}"
)
LLAMA33_STYLE = (
    '{% if not date_string is defined %}{% set date_string = "26 Jul 2024" %}{% endif %}'
    "Today Date: {{ date_string }}\n{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>{% endif %}"
)
HISTORY_STYLE = (  # prints each assistant turn's reasoning, as Qwen3's template does
    "{% for m in messages %}{{ m.role }}:{% if m.reasoning_content %}[{{ m.reasoning_content }}]{% endif %}"
    "{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)
ASK = [{"role": "user", "content": "What is today?"}]


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    return loading.load_tokenizer_only(loading.resolve(str(tiny_dir)))


def client_for(tokenizer, template: str, *, template_kwargs=None, webui=True):
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    inner.chat_template = template
    tokenizer.has_chat_template = True
    session = SimpleNamespace(
        tokenizer=tokenizer,
        engine=SimpleNamespace(vocab_size=None, context_length=2048, eos_ids=()),
        target=SimpleNamespace(resolved=SimpleNamespace(path="/m", gguf=None)),
    )
    worker = FakeWorker()
    app = create_app(session, worker, defaults=SamplingOptions(), model_id="tiny", webui=webui)
    app.state.ctx.requests.template_kwargs = dict(template_kwargs or {})
    return TestClient(app, raise_server_exceptions=False), worker


def applied(client, **body) -> str:
    r = client.post("/apply-template", json={"messages": ASK, **body})
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def test_loop_controls_parse_and_render_as_in_transformers(tokenizer):
    chat_templates.check(R7B_STYLE)  # {% break %}: refused before (no loopcontrols extension)
    client, _ = client_for(tokenizer, R7B_STYLE)
    assert applied(client).endswith("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")


def test_a_template_without_tags_is_taken_as_llama_server_does_but_a_lone_word_is_not():
    assert chat_templates.resolve("You are a plain template.") == "You are a plain template."
    with pytest.raises(chat_templates.TemplateError, match="neither a Jinja template nor one of"):
        chat_templates.resolve("chatm1")


def test_todays_date_reaches_a_llama3_style_template(tokenizer):
    client, _ = client_for(tokenizer, LLAMA33_STYLE)
    prompt = applied(client)
    assert datetime.date.today().strftime("%d %b %Y") in prompt and "26 Jul 2024" not in prompt
    client, _ = client_for(tokenizer, "{{ strftime_now('%b %d %Y') }}|{{ datetime }}")
    today = datetime.date.today().strftime("%b %d %Y")
    assert applied(client).startswith(f"{today}|{today}")


def test_add_generation_prompt_false_leaves_the_generation_prompt_out(tokenizer):
    client, _ = client_for(tokenizer, LLAMA33_STYLE)
    assert "<|start_header_id|>assistant<|end_header_id|>" in applied(client, add_generation_prompt=True)
    assert "<|start_header_id|>assistant<|end_header_id|>" not in applied(client, add_generation_prompt=False)
    r = client.post("/apply-template", json={"messages": ASK, "add_generation_prompt": "yes"})
    assert r.status_code == 400 and "add_generation_prompt" in r.json()["error"]["message"]


def test_add_generation_prompt_with_a_prefill_is_a_400(tokenizer):
    client, worker = client_for(tokenizer, LLAMA33_STYLE)
    prefill = [*ASK, {"role": "assistant", "content": "Today is"}]
    r = client.post("/v1/chat/completions", json={"messages": prefill, "add_generation_prompt": True})
    assert r.status_code == 400 and "add_generation_prompt" in r.json()["error"]["message"]
    assert client.post("/v1/chat/completions", json={"messages": prefill}).status_code == 200
    assert tokenizer.decode(worker.jobs[-1].prompt).endswith("assistant: Today is")


@pytest.mark.parametrize(
    "template,reasoning,end",
    [  # llama.cpp's test_reasoning cases, on templates of the same shape
        (R1_STYLE, "on", "<think>\n"),
        (R1_STYLE, "auto", "<think>\n"),
        (R1_STYLE, "off", "<think>\n</think>"),
        (QWEN3_STYLE, "auto", "<|im_start|>assistant\n"),
        (QWEN3_STYLE, "off", "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        (R7B_STYLE, "auto", "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
        (R7B_STYLE, "off", "<|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>"),
    ],
)
def test_reasoning_switch_tells_the_template_and_closes_an_opened_think_block(tokenizer, template, reasoning, end):
    kwargs = template_vars.server_kwargs(ServerOptions(reasoning=reasoning))
    client, worker = client_for(tokenizer, template, template_kwargs=kwargs)
    assert applied(client).endswith(end)
    # the chat route renders the same prompt, and a request's own chat_template_kwargs win
    assert client.post("/v1/chat/completions", json={"messages": ASK}).status_code == 200
    assert tokenizer.decode(worker.jobs[-1].prompt).endswith(end)
    if reasoning == "auto" and template is QWEN3_STYLE:
        off = applied(client, chat_template_kwargs={"enable_thinking": False})
        assert off.endswith("<think>\n\n</think>\n\n")


def test_serve_flags_for_template_variables_are_checked_before_loading():
    assert template_vars.server_kwargs(ServerOptions(reasoning_budget=0)) == {"enable_thinking": False}
    assert template_vars.server_kwargs(ServerOptions(chat_template_kwargs='{"x": 1}', reasoning="on")) == {
        "x": 1,
        "enable_thinking": True,
    }
    for srv, words in (
        (ServerOptions(reasoning="maybe"), "--reasoning maybe is not one of on, off, auto"),
        (ServerOptions(reasoning_budget=-2), "--reasoning-budget must be -1"),
        (ServerOptions(reasoning="on", reasoning_budget=0), "contradict"),
        (ServerOptions(chat_template_kwargs="{enable_thinking: false}"), "--chat-template-kwargs is not JSON"),
        (ServerOptions(chat_template_kwargs="[1]"), "must be a JSON object"),
    ):
        with pytest.raises(UsageError, match=words):
            template_vars.check(srv)


def test_reasoning_in_the_history_reaches_the_template(tokenizer):
    client, worker = client_for(tokenizer, HISTORY_STYLE)
    history = [
        *ASK,
        {"role": "assistant", "content": "Friday.", "reasoning_content": "check the calendar"},
        {"role": "user", "content": "Sure?"},
    ]
    assert client.post("/v1/chat/completions", json={"messages": history}).status_code == 200
    assert "assistant:[check the calendar]Friday." in tokenizer.decode(worker.jobs[-1].prompt)
    # Anthropic: thinking blocks (and redacted ones) are kept as the turn's reasoning
    blocks = [
        {"type": "thinking", "thinking": "look it up", "signature": "sig"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "text", "text": "Friday."},
    ]
    messages = [*ASK, {"role": "assistant", "content": blocks}, {"role": "user", "content": "Sure?"}]
    r = client.post("/v1/messages", json={"max_tokens": 8, "messages": messages})
    assert r.status_code == 200, r.text
    assert "assistant:[look it up]Friday." in tokenizer.decode(worker.jobs[-1].prompt)
    usage = r.json()["usage"]
    assert usage["cache_read_input_tokens"] == 0 and usage["input_tokens"] == len(worker.jobs[-1].prompt)


def test_an_image_in_a_tool_result_is_never_dropped_silently():
    """A text model refuses it (a vision model reads it: tests/test_vision_server.py); a source
    that names no image is refused naming the source."""
    import base64

    client, _ = make_client()
    call = {"type": "tool_use", "id": "t1", "name": "shot", "input": {}}

    def ask(source):
        result = {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "image", "source": source}]}
        messages = [*ASK, {"role": "assistant", "content": [call]}, {"role": "user", "content": [result]}]
        return client.post("/v1/messages", json={"max_tokens": 8, "messages": messages})

    r = ask({})
    assert r.status_code == 400 and "an image source must be" in r.json()["error"]["message"]
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
    r = ask({"type": "base64", "media_type": "image/png", "data": png})
    assert r.status_code == 400 and "this model takes text only" in r.json()["error"]["message"]


def test_generation_settings_responses_and_no_webui_match_llama_server(tokenizer):
    client, _ = make_client()  # /props: test_server.py, on a real server
    settings = client.post("/completion", json={"prompt": "hi"}).json()["generation_settings"]
    assert settings["adaptive_target"] == -1.0 and settings["dry_multiplier"] == 0.0
    for path in ("/responses", "/v1/responses"):
        r = client.post(path, json={"input": "hi"})
        assert r.status_code == 200 and r.json()["timings"]["predicted_n"] == 1, r.text
    html = {"Accept": "text/html"}
    off, _ = client_for(tokenizer, LLAMA33_STYLE, webui=False)
    assert off.get("/", headers=html).status_code == 404
    assert off.get("/", headers={"Accept": "*/*"}).status_code == 404  # as llama-server, for curl too
    assert off.get("/", headers={"Accept": "application/json"}).json()["status"] == "ok"  # probes
    on, _ = client_for(tokenizer, LLAMA33_STYLE)
    assert on.get("/", headers=html).headers["content-type"].startswith("text/html")
    assert on.get("/", headers={"Accept": "*/*"}).headers["content-type"].startswith("text/html")


@pytest.mark.parametrize(
    "flags,words",
    [
        (["--reasoning", "maybe"], "--reasoning maybe is not one of on, off, auto"),
        (["--reasoning-budget", "-5"], "--reasoning-budget must be -1 (unlimited), 0 (no thinking) or a number"),
        (["--chat-template-kwargs", "{oops"], "--chat-template-kwargs is not JSON"),
    ],
)
def test_serve_refuses_bad_template_flags_with_a_usage_error(flags, words, cli_env):
    from typer.testing import CliRunner

    from mlxcel_py.cli import app

    r = CliRunner().invoke(app, ["serve", *flags])
    assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output


def test_a_positive_reasoning_budget_caps_the_think_block_the_template_opened(tokenizer):
    from mlxcel_py.engine.thinking_budget import ThinkingBudget

    client, worker = client_for(tokenizer, R1_STYLE)
    client.app.state.ctx.requests.reasoning_budget = 3
    assert client.post("/v1/chat/completions", json={"messages": ASK}).status_code == 200
    rule = worker.jobs[-1].constraint
    assert isinstance(rule, ThinkingBudget) and rule.budget == 3 and rule.state[0] == "thinking"
    assert tokenizer.decode(list(rule.close_ids)) == "</think>"
    # under a grammar the reply is the grammar's: no budget rule
    fmt = {"type": "json_object"}
    assert client.post("/v1/chat/completions", json={"messages": ASK, "response_format": fmt}).status_code == 200
    assert not isinstance(worker.jobs[-1].constraint, ThinkingBudget)


def test_a_request_s_own_thinking_budget_applies_where_the_server_sets_none(tokenizer):
    """llama-server's `thinking_budget_tokens` (and Anthropic's `thinking.budget_tokens`, which it
    maps there) cap one reply's think block when --reasoning-budget is -1; the server's own wins."""
    from mlxcel_py.engine.thinking_budget import ThinkingBudget

    client, worker = client_for(tokenizer, R1_STYLE)
    assert client.post("/v1/chat/completions", json={"messages": ASK}).status_code == 200
    assert worker.jobs[-1].constraint is None  # -1 and nothing asked: unlimited
    for asked in (5, 0):
        r = client.post("/v1/chat/completions", json={"messages": ASK, "thinking_budget_tokens": asked})
        assert r.status_code == 200
        rule = worker.jobs[-1].constraint
        assert isinstance(rule, ThinkingBudget) and rule.budget == asked and rule.state[0] == "thinking"
    # budget 0: the close is the only token the first step may take
    assert rule.forced(rule.state) == rule.close_ids[0]
    body = {"model": "m", "max_tokens": 8, "messages": ASK, "thinking": {"type": "enabled", "budget_tokens": 7}}
    assert client.post("/v1/messages", json=body).status_code == 200
    assert worker.jobs[-1].constraint.budget == 7
    body["thinking"] = {"type": "disabled"}
    assert client.post("/v1/messages", json=body).status_code == 200 and worker.jobs[-1].constraint is None
    for bad in ({"thinking_budget_tokens": -3}, {"thinking_budget_tokens": 2.5}):
        r = client.post("/v1/chat/completions", json={"messages": ASK, **bad})
        assert r.status_code == 400 and "thinking_budget_tokens" in r.json()["error"]["message"]
    body["thinking"] = {"type": "enabled", "budget_tokens": -1}
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 400 and "budget_tokens" in r.text
    client.app.state.ctx.requests.reasoning_budget = 3  # the server's own wins over the request's
    r = client.post("/v1/chat/completions", json={"messages": ASK, "thinking_budget_tokens": 50})
    assert r.status_code == 200 and worker.jobs[-1].constraint.budget == 3


@pytest.mark.parametrize("kwargs", [{"tokenize": False}, {"return_dict": True}, {"messages": []}, {"tools": 1}])
def test_template_variables_that_are_the_renderers_arguments_are_refused(tokenizer, kwargs):
    """`tokenize: false` as a template variable made transformers return text where ids belong."""
    client, worker = client_for(tokenizer, QWEN3_STYLE)
    r = client.post("/v1/chat/completions", json={"messages": ASK, "chat_template_kwargs": kwargs})
    assert r.status_code == 400 and "chat_template_kwargs" in r.json()["error"]["message"]
    assert client.post("/v1/chat/completions", json={"messages": ASK}).status_code == 200  # still serving
    assert all(isinstance(t, int) for t in worker.jobs[-1].prompt)
    with pytest.raises(UsageError, match="cannot be set as template variables"):
        template_vars.check(ServerOptions(chat_template_kwargs=json.dumps(kwargs)))


def test_auto_tells_a_template_that_can_think_to_think_and_firefunction_gets_its_functions(tokenizer):
    """llama-server always passes `enable_thinking` (auto: whether the template can think): llama.cpp's
    R1 file closes the block on `not enable_thinking`, so an unset one must not reach it; FireFunction
    adds `functions` to a string, which llama.cpp passes (the tools as JSON, or "")."""
    r1_file_style = R1_STYLE.replace(
        "<think>\n{% endif %}", "<think>\n{% if not enable_thinking %}</think>{% endif %}{% endif %}"
    )
    client, _ = client_for(tokenizer, r1_file_style)
    assert applied(client).endswith("<｜Assistant｜><think>\n")
    client, _ = client_for(tokenizer, r1_file_style, template_kwargs={"enable_thinking": False})
    assert applied(client).endswith("<think>\n</think>")
    client, _ = client_for(tokenizer, "{{ 'Available:' + functions + '|' }}{{ messages[0].content }}")
    assert applied(client).startswith("Available:|")
    tool = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
    ids = render_messages(tokenizer, ASK, tools=[tool])
    assert json.loads(tokenizer.decode(ids).split("|")[0][len("Available:") :]) == [tool]
