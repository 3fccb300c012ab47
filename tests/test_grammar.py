"""Structured output (engine/grammar.py): JSON schemas, GBNF, Lark and regex through llguidance, with
speculation left on.

The real default model: greedy prompt lookup under a JSON schema equals plain constrained decoding
token for token, with drafts accepted; seeded sampling under it always yields schema-valid JSON.
The faces: `generate --json-schema/--grammar` (bad grammars refused before any model loads), and
`serve`'s `response_format` (official openai client), llama-server's `json_schema` and `grammar`
fields, and 400s for grammars that do not compile, the server serving on.
"""

from __future__ import annotations

import json
import subprocess
import time

import jsonschema
import pytest
from conftest import mlxcel_cmd

from mlxcel_py.engine.grammar import TokenizerIndex
from mlxcel_py.formats.grammars import GrammarError, GrammarSpec, check

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "city": {"type": "string", "maxLength": 40},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4},
    },
    "required": ["name", "city", "tags"],
    "additionalProperties": False,
}
COPY = (
    'Return this record as JSON with the keys name, city and tags: name "Ada Lovelace", city "London", '
    'tags ["math", "engines", "poetry"]'
)


@pytest.mark.parametrize(
    "spec,message",
    [
        (GrammarSpec("gbnf", 'root ::= "yes" | missing'), "GBNF grammar does not compile: .*missing"),
        (GrammarSpec("json_schema", "{not json"), "JSON schema does not compile"),
        (GrammarSpec("json_schema", '{"type": "nonsense"}'), "JSON schema does not compile"),
        (GrammarSpec("regex", "a(b"), "regex does not compile"),
        (GrammarSpec("lark", "start: ("), "Lark grammar does not compile"),
    ],
)
def test_a_grammar_that_does_not_compile_is_one_clear_error(spec, message):
    with pytest.raises(GrammarError, match=message):
        check(spec)


@pytest.fixture(scope="module")
def engine(real):
    from mlxcel_py.engine.engine import Engine

    eng = Engine(real.model, eos_ids=real.tokenizer.eos_token_ids, vocab_size=real.vocab_size, context_length=2048)
    index = TokenizerIndex(real.tokenizer._tokenizer, real.vocab_size, real.tokenizer.eos_token_ids)
    from mlxcel_py.formats.prompting import render_messages

    prompt = render_messages(real.tokenizer, [{"role": "user", "content": COPY}])
    return eng, index, prompt, real.tokenizer


def _run(eng, prompt, constraint, **kw):
    g = eng.generate(prompt, max_tokens=120, constraint=constraint, **kw)
    return [e.token for e in g], g


def test_greedy_speculation_under_a_schema_equals_plain_constrained_decoding(engine):
    from mlxcel_py.drafters.prompt_lookup import PromptLookupDrafter
    from mlxcel_py.engine.policy import make_policy

    eng, index, prompt, tok = engine
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA))
    plain, gp = _run(eng, prompt, index.compile(spec), speculative=False)
    fast, gs = _run(eng, prompt, index.compile(spec), drafter=PromptLookupDrafter(), policy=make_policy("cost", 7))
    assert fast == plain
    jsonschema.validate(json.loads(tok.decode(plain)), SCHEMA)
    assert gs.stats.drafted_rounds > 0 and gs.stats.accepted > 0
    assert gp.finish_reason == gs.finish_reason == "stop"
    # unconstrained, this model does not answer with bare JSON: the grammar did the work
    free, _ = _run(eng, prompt, None, speculative=False)
    assert free != plain


def test_sampling_under_a_schema_always_gives_valid_json(engine):
    from mlxcel_py.drafters.prompt_lookup import PromptLookupDrafter
    from mlxcel_py.engine.policy import make_policy
    from mlxcel_py.options import SamplingOptions

    eng, index, prompt, tok = engine
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA))
    for seed in range(3):
        sampling = SamplingOptions(temp=1.0, seed=seed)
        out, g = _run(
            eng,
            prompt,
            index.compile(spec),
            sampling=sampling,
            drafter=PromptLookupDrafter(),
            policy=make_policy("cost", 7),
        )
        jsonschema.validate(json.loads(tok.decode(out)), SCHEMA)
        assert g.finish_reason == "stop"


def test_a_regex_and_a_gbnf_choice(engine):
    eng, index, prompt, tok = engine
    out, _ = _run(eng, prompt, index.compile(GrammarSpec("gbnf", 'root ::= "yes" | "no"')), speculative=False)
    assert tok.decode(out) in ("yes", "no")
    out, _ = _run(eng, prompt, index.compile(GrammarSpec("regex", r"[0-9]{3}-[0-9]{4}")), speculative=False)
    assert len(tok.decode(out)) == 8 and tok.decode(out)[3] == "-"


# ---- the faces -----------------------------------------------------------------------------------


def test_cli_generate_json_schema_and_grammar(cli_env, tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMA))
    base = mlxcel_cmd() + ["generate", "-p", COPY, "-n", "120"]
    plain = subprocess.run(
        base + ["--json-schema-file", str(schema)], capture_output=True, text=True, env=cli_env, timeout=300
    )
    spec = subprocess.run(
        base + ["--json-schema", json.dumps(SCHEMA), "--prompt-lookup", "--profile"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=300,
    )
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout
    jsonschema.validate(json.loads(spec.stdout), SCHEMA)
    yn = subprocess.run(
        base + ["--grammar", 'root ::= "yes" | "no"'], capture_output=True, text=True, env=cli_env, timeout=300
    )
    assert yn.returncode == 0 and yn.stdout.strip() in ("yes", "no")


@pytest.mark.parametrize(
    "args,message",
    [
        (["--grammar", 'root ::= "a" | nope'], "--grammar: the GBNF grammar does not compile"),
        (["--json-schema", "{oops"], "--json-schema: the JSON schema does not compile"),
        (["--json-schema", "{}", "--grammar", 'root ::= "a"'], "--grammar and --json-schema"),
        (["--grammar-file", "/nonexistent/g.gbnf"], "--grammar-file /nonexistent/g.gbnf: no such file"),
        (["--json-schema-file", "/bin/sh"], "--json-schema-file /bin/sh: is not UTF-8 text"),
        (["--no-prompt", "--json-schema", "{}"], "--json-schema needs a one-shot prompt (-p/--prompt)"),
    ],
)
def test_cli_refuses_a_bad_grammar_before_loading(args, message, cli_env):
    prompt = [] if "--no-prompt" in args else ["-p", "x"]
    args = [a for a in args if a != "--no-prompt"]
    r = subprocess.run(
        mlxcel_cmd() + ["generate", *prompt, "-m", "/nonexistent-model", *args],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert "nonexistent-model" not in r.stderr  # refused before the model was looked at


def test_serve_structured_output_with_the_openai_client(cli_env):
    from openai import OpenAI
    from test_server import post, start_server

    proc, url, _ = start_server(cli_env, "--draft-kind", "prompt-lookup")
    try:
        client = OpenAI(base_url=url + "/v1", api_key="none")
        messages = [{"role": "user", "content": COPY}]
        r = client.chat.completions.create(
            model="m",
            messages=messages,
            max_tokens=120,
            temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}},
        )
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
        assert r.choices[0].finish_reason == "stop"
        obj = client.chat.completions.create(
            model="m", messages=messages, max_tokens=120, temperature=0, response_format={"type": "json_object"}
        )
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
        # llama-server's own fields, on its native route
        status, body = post(url + "/completion", {"prompt": "Is water wet?", "grammar": 'root ::= "yes" | "no"'})
        assert status == 200 and body["content"] in ("yes", "no"), body
        status, body = post(url + "/completion", {"prompt": COPY, "n_predict": 120, "json_schema": SCHEMA})
        assert status == 200, body
        jsonschema.validate(json.loads(body["content"]), SCHEMA)
        for bad, message in (
            ({"grammar": 'root ::= "a" | nope'}, "'grammar': the GBNF grammar does not compile"),
            ({"json_schema": {"type": "nonsense"}}, "'json_schema': the JSON schema does not compile"),
            ({"response_format": {"type": "json_schema"}}, "'response_format': json_schema needs"),
            ({"response_format": {"type": "yaml"}}, "'response_format': type must be"),
            ({"grammar": "x", "json_schema": {}}, "one of 'grammar', 'json_schema' and 'response_format'"),
        ):
            status, body = post(url + "/v1/completions", {"prompt": "x", **bad})
            assert status == 400 and message in body["error"]["message"], (bad, body)
        status, body = post(url + "/v1/completions", {"prompt": "1, 2, 3,", "max_tokens": 4})
        assert status == 200  # still serving
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# ---- hostile grammars (#47): bounded before llguidance, compiled where its stack cannot overflow ---


def chain_schema(n: int) -> dict:
    """A schema whose `$ref`s chain n definitions deep (llguidance recurses once per link)."""
    defs = {
        f"d{i}": {
            "type": "object",
            "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}},
            "required": ["a"],
            "additionalProperties": False,
        }
        for i in range(n)
    }
    return {"$defs": {**defs, f"d{n}": {"type": "string"}}, "$ref": "#/$defs/d0"}


def chain_gbnf(n: int) -> str:
    return "root ::= r0\n" + "".join(f'r{i} ::= "a" r{i + 1}\n' for i in range(n)) + f'r{n} ::= "b"\n'


@pytest.mark.parametrize(
    "spec,message",
    [
        (GrammarSpec("json_schema", json.dumps(chain_schema(1000))), "1001 definitions; the limit is 1000"),
        (GrammarSpec("gbnf", chain_gbnf(4000)), "4002 rules; the limit is 1000"),
        (GrammarSpec("lark", "start: r0\n" + "".join(f'r{i}: "a"\n' for i in range(1001))), "the limit is 1000"),
        (GrammarSpec("regex", "a" * 300_000), "300000 characters; the limit is 262144"),
        (GrammarSpec("json_schema", '{"items": ' * 65 + "{}" + "}" * 65), "nests more than 64 levels"),
        (GrammarSpec("json_schema", '{"a": ' * 20_000 + "1" + "}" * 20_000), "nests more than 64 levels"),
        (
            GrammarSpec("json_schema", json.dumps({"anyOf": [{"$ref": "#/$defs/x"}] * 1001, "$defs": {"x": {}}})),
            "1001 '[$]ref's; the limit is 1000",
        ),
    ],
)
def test_a_grammar_over_a_limit_is_refused_before_llguidance_sees_it(spec, message, monkeypatch):
    import llguidance

    def never(*_):
        raise AssertionError("llguidance was called")

    monkeypatch.setattr(llguidance, "grammar_from", never)
    with pytest.raises(GrammarError, match=message):
        check(spec)


def test_the_deepest_chain_within_the_limits_compiles_where_the_default_stack_overflows(tmp_path):
    """999 chained `$ref`s: llguidance on an ordinary 8 MiB thread stack segfaults (the server
    died of this), on formats.grammars' own thread it compiles."""
    schema = tmp_path / "chain.json"
    schema.write_text(json.dumps(chain_schema(999)))
    script = (
        "import sys, llguidance\n"
        "from mlxcel_py.formats.grammars import GrammarSpec, check\n"
        "text = open(sys.argv[2]).read()\n"
        "if sys.argv[1] == 'ours':\n"
        "    check(GrammarSpec('json_schema', text)); print('compiled')\n"
        "else:\n"
        "    llguidance.LLMatcher.validate_grammar(llguidance.grammar_from('json_schema', text)); print('compiled')\n"
    )
    import sys

    ours = subprocess.run([sys.executable, "-c", script, "ours", str(schema)], capture_output=True, text=True)
    assert ours.returncode == 0 and ours.stdout.strip() == "compiled", ours.stderr[-2000:]
    bare = subprocess.run([sys.executable, "-c", script, "bare", str(schema)], capture_output=True, text=True)
    assert bare.returncode < 0 and "compiled" not in bare.stdout  # killed by a signal (SIGSEGV)


def test_a_compile_past_its_time_budget_fails_and_an_error_in_it_reaches_the_caller():
    import time

    from mlxcel_py.formats.grammars import native

    start = time.perf_counter()
    with pytest.raises(GrammarError, match="did not compile within 0.2 s"):
        native(time.sleep, 3, seconds=0.2)
    assert time.perf_counter() - start < 2
    with pytest.raises(ZeroDivisionError):
        native(lambda: 1 / 0)
    assert native(lambda x: x + 1, 41) == 42


def test_cli_refuses_an_oversized_grammar_with_exit_2(cli_env, tmp_path):
    schema = tmp_path / "chain.json"
    schema.write_text(json.dumps(chain_schema(1000)))
    r = subprocess.run(
        mlxcel_cmd() + ["generate", "-p", "x", "-m", "/nonexistent-model", "--json-schema-file", str(schema)],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert "--json-schema-file: the JSON schema has 1001 definitions; the limit is 1000" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_server_refuses_hostile_grammars_on_every_route_and_keeps_serving(cli_env):
    """A 125 KB body took the server down (segfault, no log line) on every route with a grammar."""
    import threading
    import urllib.error
    import urllib.request

    from test_server import get, post, start_server

    proc, url, _ = start_server(cli_env)
    try:
        chain = chain_schema(1000)
        tool = {"type": "function", "function": {"name": "f", "parameters": chain}}
        msgs = [{"role": "user", "content": "hi"}]
        cases = [
            ("/completion", {"prompt": "hi", "n_predict": 2, "json_schema": chain}),
            ("/completion", {"prompt": "hi", "n_predict": 2, "grammar": chain_gbnf(4000)}),
            ("/v1/chat/completions", {"messages": msgs, "response_format": {"type": "json_object", "schema": chain}}),
            ("/v1/chat/completions", {"messages": msgs, "tools": [tool]}),
            ("/v1/messages", {"max_tokens": 2, "messages": msgs, "tools": [{"name": "f", "input_schema": chain}]}),
            ("/v1/responses", {"input": "hi", "text": {"format": {"type": "json_schema", "schema": chain}}}),
        ]
        for path, body in cases:
            # text/plain, as curl --data-binary sends it
            req = urllib.request.Request(
                url + path, data=json.dumps(body).encode(), headers={"Content-Type": "text/plain"}
            )
            try:
                urllib.request.urlopen(req, timeout=60)
                raise AssertionError(f"{path} accepted a hostile grammar")
            except urllib.error.HTTPError as e:
                err = json.loads(e.read())["error"]
                assert e.code == 400 and "the limit is 1000" in err["message"], (path, err)
        assert proc.poll() is None and get(url + "/health")["status"] == "ok"
        # a slow grammar within the limits (llguidance's GBNF converter takes seconds over this
        # chain) compiles off the event loop: /health answers at once meanwhile, where it waited
        # for the whole compile when that ran on the loop
        done: list = []

        def slow() -> None:
            start = time.perf_counter()
            status, _ = post(url + "/completion", {"prompt": "hi", "n_predict": 2, "grammar": chain_gbnf(998)})
            done.append((status, time.perf_counter() - start))

        thread = threading.Thread(target=slow)
        thread.start()
        time.sleep(0.2)
        start = time.perf_counter()
        assert get(url + "/health")["status"] == "ok"
        health_s = time.perf_counter() - start
        thread.join(timeout=60)
        assert done and done[0][0] == 200, done
        assert health_s < done[0][1] / 3, (health_s, done)  # not held up by the compile
        # more than asyncio's shared pool has threads (min(32, cores + 4)) queue behind each other
        # on their own pool: a plain chat request is not held up (on the shared pool, 8 of them
        # held one 17 s on this 2-core machine)
        import os

        done.clear()
        threads = [threading.Thread(target=slow) for _ in range(min(min(32, (os.cpu_count() or 1) + 4) + 1, 9))]
        for t in threads:
            t.start()
        time.sleep(0.3)
        start = time.perf_counter()
        status, _ = post(url + "/v1/chat/completions", {"messages": msgs, "max_tokens": 2})
        chat_s = time.perf_counter() - start
        for t in threads:
            t.join(timeout=120)
        assert status == 200 and [d[0] for d in done] == [200] * len(threads), done
        assert chat_s < max(d[1] for d in done) / 3, (chat_s, done)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
