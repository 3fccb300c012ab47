"""Real chat templates through `serve`'s tool calls: does each render and parse here?

    python scripts/tool_templates.py TEMPLATE.jinja [...] [-m MODEL] [--markdown]
    python scripts/tool_templates.py ~/src/llama.cpp/models/templates/*.jinja

Templates are the models' own (a llama.cpp checkout's models/templates, vLLM's
examples/tool_chat_template_*.jinja, a model's tokenizer_config.json chat_template saved to a
file); none ship with this repository, their licences being their authors'. For each, a server
runs the default model (or -m) with `--chat-template-file` and the official openai client sends:

- a required call (`tool_choice: "required"`): it must come back as a call of the tool, with
  arguments that are a JSON object holding the required key;
- the same request streamed: the `delta.tool_calls` pieces must assemble to the same call;
- a named call (`tool_choice: {"function": {"name": ...}}`): a call of that tool;
- the history with that call and its `tool` result (no `name`, as OpenAI clients send it), free
  to answer: it must render (a 200) whatever the small model then says.

A 135M model's arguments are not meant to be right, only well-formed: this checks rendering,
the call format each template implies, and parsing. Exit status 1 when any template fails.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "the city"},
                "unit": {"type": "string", "enum": ["c", "f"], "description": "the unit"},
            },
            "required": ["city"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def serve(template: Path, model: str | None) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "mlxcel_py", "serve", "--port", "0", "--chat-template-file", str(template)]
    proc = subprocess.Popen(cmd + (["-m", model] if model else []), stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if m := re.search(r"listening on (http://127\.0\.0\.1:\d+)", line):
            return proc, m.group(1)
    proc.kill()
    raise RuntimeError(f"{template.name}: the server did not start")


def check(url: str) -> dict[str, str]:
    """Each check's outcome: "ok" or what went wrong."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    base = dict(model="m", tools=[TOOL], max_tokens=96, temperature=0)
    out: dict[str, str] = {}

    def call_of(message) -> tuple[str, dict] | None:
        calls = message.tool_calls or []
        if len(calls) != 1:
            return None
        args = json.loads(calls[0].function.arguments)
        return (calls[0].function.name, args) if isinstance(args, dict) else None

    try:
        r = client.chat.completions.create(messages=ASK, tool_choice="required", **base)
        got = call_of(r.choices[0].message)
        ok = got is not None and got[0] == "get_weather" and "city" in got[1]
        out["required"] = "ok" if ok else f"no well-formed call ({r.choices[0].finish_reason})"
        stream = client.chat.completions.create(messages=ASK, tool_choice="required", stream=True, **base)
        name, args = "", ""
        for ev in stream:
            for piece in (ev.choices[0].delta.tool_calls or []) if ev.choices else []:
                name += (piece.function and piece.function.name) or ""
                args += (piece.function and piece.function.arguments) or ""
        same = got is not None and name == got[0] and json.loads(args or "null") == got[1]
        out["streamed"] = "ok" if same else f"assembled {name!r} {args[:60]!r}"
        named = {"type": "function", "function": {"name": "get_weather"}}
        r = client.chat.completions.create(messages=ASK, tool_choice=named, **base)
        got2 = call_of(r.choices[0].message)
        out["named"] = "ok" if got2 and got2[0] == "get_weather" else "no call of the named tool"
        arguments = json.dumps(got[1] if got else {"city": "Paris"})
        history = ASK + [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call0123456789",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call0123456789", "content": '{"temp": 18, "sky": "clear"}'},
        ]
        client.chat.completions.create(messages=history, **dict(base, max_tokens=24))
        out["history"] = "ok"
    except openai.APIStatusError as exc:
        out[next(k for k in ("required", "streamed", "named", "history") if k not in out)] = (
            f"{exc.status_code}: {str(exc.message)[:80]}"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("templates", nargs="+", type=Path)
    ap.add_argument("-m", "--model", help="model (default: the default model)")
    a = ap.parse_args()
    failed = 0
    print("| template | required | streamed | named | history |")
    print("|---|---|---|---|---|")
    for template in a.templates:
        proc, url = serve(template, a.model)
        try:
            res = check(url)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        cells = [res.get(k, "not reached") for k in ("required", "streamed", "named", "history")]
        failed += any(c != "ok" for c in cells)
        print(f"| {template.name} | " + " | ".join(cells) + " |", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
