"""Structured output and tool calls on the default model: the grammar's per-token cost, and
speculation under it.

    python scripts/grammar_cost.py [--max-tokens 160] [--rounds 3] [--json out.json]

Two requests as `serve` builds them (its RequestReader: chat template, tool prompt, grammar):
`structured`, a record given in the prompt to be returned as JSON under a JSON schema; and
`tool-call`, a chat request with one tool and `tool_choice: "required"` whose arguments copy
details from the user's message. Greedy, plain constrained decoding against prompt lookup under the
same grammar, interleaved, each the median of `--rounds`. Both outputs must be equal token for
token (the script fails otherwise). Reported: tok/s of each and their ratio, the acceptance, and the
grammar's own time per token (mask computation, llguidance on the 49,152-token vocabulary) as a
share of the decode step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from mlxcel_py.cpu import blas

blas.prepare()

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "email": {"type": "string"},
        "city": {"type": "string"},
        "languages": {"type": "array", "items": {"type": "string"}},
        "active": {"type": "boolean"},
    },
    "required": ["name", "email", "city", "languages", "active"],
    "additionalProperties": False,
}
RECORD = (
    'name: "Ada Lovelace", email: "ada.lovelace@analytical-engine.org", city: "London", '
    'languages: ["English", "French", "Italian", "Mathematics"], active: true'
)
PROMPT = f"Return this record as JSON with the keys name, email, city, languages and active:\n{RECORD}"
TOOL = {
    "type": "function",
    "function": {
        "name": "create_contact",
        "description": "Add a person to the address book.",
        "parameters": {
            "type": "object",
            # no free-text field: under the closed schema a tool call's grammar now uses
            # (tool_calls.closed, as llama.cpp's), the 135M model never ended a "notes" string (it
            # ends strings with its `",` token to add a key, which a closed object refuses there)
            "properties": {
                "name": {"type": "string"},
                "email": {"type": "string"},
                "city": {"type": "string"},
                "company": {"type": "string"},
            },
            "required": ["name", "email", "city", "company"],
        },
    },
}
TOOL_MESSAGE = (
    "Please add Ada Lovelace to my contacts: her email is ada.lovelace@analytical-engine.org, she lives "
    "in London, and she works at the Analytical Engine Company, which she co-founded for the "
    "Bernoulli numbers program."
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import mlxcel_py as mc
    from mlxcel_py.drafters.prompt_lookup import PromptLookupDrafter
    from mlxcel_py.engine.grammar import GrammarSpec, TokenizerIndex
    from mlxcel_py.engine.policy import make_policy

    model = mc.load()
    eng = model.engine
    tok = model.tokenizer
    index = TokenizerIndex(getattr(tok, "_tokenizer", tok), eng.vocab_size, eng.eos_ids)
    from mlxcel_py.options import SamplingOptions
    from mlxcel_py.server import schemas
    from mlxcel_py.server.requests import RequestReader

    reader = RequestReader(tok, eng.vocab_size, eng.context_length, SamplingOptions(), -1)
    chat = schemas.ChatRequest.model_validate(
        {"messages": [{"role": "user", "content": TOOL_MESSAGE}], "tools": [TOOL], "tool_choice": "required"}
    )
    _, tool_spec = reader.tools(chat)
    cases = {
        "structured": (model.encode(PROMPT), GrammarSpec("json_schema", json.dumps(SCHEMA))),
        "tool-call": (reader.chat_prompt(chat.messages, chat.tools), tool_spec),
    }
    out_rows = {}
    for case, (ids, spec) in cases.items():
        row = measure(eng, tok, index, ids, spec, a, make_policy, PromptLookupDrafter)
        if row is None:
            print(f"{case}: speculative output differs from plain constrained output", file=sys.stderr)
            return 1
        p = row["plain"]
        print(
            f"{case}: {row['tokens']} tokens; plain constrained {p['tok_s']:.1f} tok/s, prompt lookup under the "
            f"grammar {row['prompt-lookup']['tok_s']:.1f} tok/s ({row['speedup']:.2f}x, accepted "
            f"{row['prompt-lookup']['accepted']}/{row['prompt-lookup']['proposed']}); grammar "
            f"{p['mask_ms_per_token']:.3f} ms a token of a {p['step_ms_per_token']:.2f} ms plain step",
            file=sys.stderr,
        )
        out_rows[case] = row
    if a.json:
        Path(a.json).write_text(json.dumps(out_rows, indent=2) + "\n")
    return 0


def measure(eng, tok, index, ids, spec, a, make_policy, PromptLookupDrafter) -> dict | None:
    """Plain against prompt lookup under one grammar, interleaved; None if their outputs differ."""
    runs: dict[str, list] = {"plain": [], "prompt-lookup": []}
    texts = {}
    for _ in range(a.rounds):
        for name in runs:
            c = index.compile(spec)
            kw = {}
            if name != "plain":
                kw = {"drafter": PromptLookupDrafter(), "policy": make_policy("cost", 7)}
            g = eng.generate(ids, max_tokens=a.max_tokens, constraint=c, speculative=name != "plain", **kw)
            t0 = time.perf_counter()
            out = [e.token for e in g]
            dt = time.perf_counter() - t0
            runs[name].append((len(out) / dt, c.mask_s / max(1, len(out)), dt / max(1, len(out)), g.stats))
            texts[name] = out
    if texts["plain"] != texts["prompt-lookup"]:
        return None
    row: dict = {}
    for name, rs in runs.items():
        row[name] = {
            "tok_s": statistics.median(r[0] for r in rs),
            "mask_ms_per_token": statistics.median(r[1] for r in rs) * 1e3,
            "step_ms_per_token": statistics.median(r[2] for r in rs) * 1e3,
            "accepted": rs[-1][3].accepted,
            "proposed": rs[-1][3].proposed,
        }
    row["speedup"] = row["prompt-lookup"]["tok_s"] / row["plain"]["tok_s"]
    row["tokens"] = len(texts["plain"])
    row["reply"] = tok.decode(texts["plain"])
    if spec.kind == "json_schema":
        json.loads(row["reply"])  # the schema's reply is JSON, whatever the model says
    return row


if __name__ == "__main__":
    raise SystemExit(main())
