"""The texts flags give as output formats: `--chat-template[-file]` and `--grammar[-file]` /
`--json-schema[-file]`, read (files bounded: inputs.files) and checked to parse or compile before
any model loads (pure: validate.py calls these). Each refusal is a UsageError naming the flag."""

from __future__ import annotations

from ..errors import UsageError
from ..inputs.files import MIB, UnreadableFile, read_text
from ..options import CommandOptions
from . import chat_templates
from .grammars import GrammarError, GrammarSpec
from .grammars import check as check_grammar

FILE_LIMIT = MIB  # bytes of a --grammar-file, --json-schema-file or --chat-template-file


def chat_template(opts: CommandOptions) -> str | None:
    """--chat-template NAME|TEMPLATE or --chat-template-file FILE: the template text, checked to parse."""
    m = opts.model
    if m.chat_template is not None and m.chat_template_file is not None:
        raise UsageError("--chat-template and --chat-template-file both set the template; pass one")
    try:
        if m.chat_template is not None:
            return chat_templates.resolve(m.chat_template)
        if m.chat_template_file is None:
            return None
        try:
            text = read_text(m.chat_template_file, FILE_LIMIT)
        except UnreadableFile as exc:
            raise UsageError(f"--chat-template-file {m.chat_template_file}: {exc}") from None
        chat_templates.check(text)
        return text
    except chat_templates.TemplateError as exc:
        flag = "--chat-template" if m.chat_template is not None else f"--chat-template-file {m.chat_template_file}"
        raise UsageError(f"{flag}: {exc}") from None


def grammar(opts: CommandOptions) -> GrammarSpec | None:
    """--grammar/--grammar-file/--json-schema/--json-schema-file: one at most, on generate and run,
    readable, and compiling (no model needed)."""
    g = opts.generation
    given = [
        (flag, value, kind, is_file)
        for flag, value, kind, is_file in (
            ("--grammar", g.grammar, "gbnf", False),
            ("--grammar-file", g.grammar_file, "gbnf", True),
            ("--json-schema", g.json_schema, "json_schema", False),
            ("--json-schema-file", g.json_schema_file, "json_schema", True),
        )
        if value is not None
    ]
    if not given:
        return None
    if len(given) > 1:
        raise UsageError(f"{given[0][0]} and {given[1][0]} both constrain the output; pass one")
    flag, value, kind, is_file = given[0]
    if opts.command not in ("generate", "run"):
        raise UsageError(
            f"{flag} is a generate/run option; "
            + (
                "serve takes a grammar per request ('grammar', 'json_schema', 'response_format')"
                if opts.command == "serve"
                else f"drop it on {opts.command}"
            )
        )
    if opts.generation.prompt is None:  # without -p, generate and run chat
        raise UsageError(f"{flag} needs a one-shot prompt (-p/--prompt); an interactive chat takes no grammar")
    text = value
    if is_file:
        try:
            text = read_text(value, FILE_LIMIT)
        except UnreadableFile as exc:
            raise UsageError(f"{flag} {value}: {exc}; pass a grammar or schema file") from None
    spec = GrammarSpec(kind, text)
    try:
        check_grammar(spec)
    except GrammarError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    return spec
