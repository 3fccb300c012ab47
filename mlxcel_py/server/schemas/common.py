"""What every route's body shares: strict parsing, the sampling fields, messages and tools (the
OpenAI shapes other families reuse), prompts, and the helpers routes use on any body (`describe`,
`refuse_unsupported`, `grammar_spec`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ...formats.grammars import LIMITS, GrammarError, GrammarSpec
from ...formats.grammars import check as check_grammar
from ...options import MAX_DRAFT_LIMIT

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
TopCount = Annotated[int, Field(ge=0, le=20)]
MAX_STOPS, MAX_STOP_CHARS = 32, 1000
MAX_CHOICES = 16  # `n`: choices decoded side by side for one request
Choices = Annotated[int, Field(ge=1, le=MAX_CHOICES)]
ROLES = ("system", "user", "assistant", "tool", "developer")
# fields whose meaning we cannot honour yet: refused by name instead of ignored behind a 200
UNSUPPORTED = ("functions",)


def _bounded_stops(v):
    """A stop field's strings, at most MAX_STOPS of at most MAX_STOP_CHARS characters (validators)."""
    stops = [v] if isinstance(v, str) else v or []
    if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stops):
        raise ValueError(f"at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters")
    return v


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class Sampling(_Body):
    """Fields every generation route reads (OpenAI and llama-server spellings)."""

    model: str | None = None
    temperature: FiniteFloat | None = None
    top_p: FiniteFloat | None = None
    top_k: int | None = None
    min_p: FiniteFloat | None = None
    seed: int | None = None
    repeat_penalty: FiniteFloat | None = None
    repetition_penalty: FiniteFloat | None = None
    stop: Union[str, list[str], None] = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n_predict: int | None = None
    ignore_eos: bool = False
    stream: bool = False
    # llama-server's per-request draft width; 0 decodes this request plainly (the chat page's
    # "plain next"), other widths are the server's own (--draft-max), so they are refused
    speculative_n_max: int | None = Field(None, alias="speculative.n_max")
    # llama-server's per-request reasoning budget, where the server's --reasoning-budget is -1:
    # the reply's think block is closed after this many tokens (0: at once)
    thinking_budget_tokens: int | None = Field(None, ge=0)
    # llama-server's per-request --draft-min: drafts shorter than this are not verified
    speculative_n_min: int | None = Field(None, alias="speculative.n_min", ge=0, le=MAX_DRAFT_LIMIT)
    # llama-server's limit on decoding time (ms, from the first token; 0 none), within the server's
    t_max_predict_ms: int | None = None
    # llama-server's prompt cache switch: false feeds the whole prompt, reusing no cached prefix
    # (the text is the same either way on the row-exact path; only the time differs); null is
    # the default, as llama-server reads it
    cache_prompt: bool | None = None
    # llama-server's context shift (--context-shift): prompt tokens kept (-1 all), tokens dropped (0 half)
    n_keep: int | None = Field(None, ge=-1)
    n_discard: int | None = Field(None, ge=0)

    @field_validator("speculative_n_max")
    @classmethod
    def _plain_only(cls, v):
        if v is not None and v != 0:
            raise ValueError("only 0 (decode this request plainly) is taken; the draft width is the server's own")
        return v

    def speculative(self) -> bool:
        return self.speculative_n_max is None

    def thinking_budget(self) -> int | None:
        """The thinking budget this request asks for (None: none of its own)."""
        return self.thinking_budget_tokens

    @field_validator("stop")
    @classmethod
    def _bounded_stops(cls, v):
        return _bounded_stops(v)

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return [s for s in stops if s]

    def requested_tokens(self) -> int | None:
        for n in (self.max_tokens, self.max_completion_tokens, self.n_predict):
            if n is not None:
                return n
        return None


class TextPart(_Body):
    """A content part: text, or an image (OpenAI's `image_url`: {"url": ...}; Responses' `input_image`: a URL)."""

    type: str
    text: str | None = None
    image_url: Union[str, dict[str, Any], None] = None

    def url(self) -> Any:
        return self.image_url.get("url") if isinstance(self.image_url, dict) else self.image_url


IMAGE_PART_TYPES = ("image_url", "input_image")


def image_part(url: str, where: str) -> dict:
    """An image among a turn's content parts, in the one shape every API family's form becomes
    (server.image_parts reads it); `where` names it in a refusal."""
    return {"type": "image", "url": url, "where": where}


class FunctionCall(_Body):
    name: str
    arguments: Union[str, dict[str, Any]] = "{}"


class ToolCallIn(_Body):
    """An earlier assistant turn's call, as clients send the history back."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Function(_Body):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _compiles(cls, v):
        return schema_that_compiles(v)


def schema_that_compiles(v: dict | None) -> dict | None:
    """A tool's argument schema, checked to compile (ValueError with the compiler's message)."""
    if v is not None:
        import json

        try:
            check_grammar(GrammarSpec("json_schema", json.dumps(v)))
        except GrammarError as exc:
            raise ValueError(str(exc)) from None
    return v


def tools_within_limit(v):
    """A request's tools, refused before any is compiled when their schemas together are longer
    than one grammar may be: the reply's grammar holds them all, and each is compiled on its own
    first, so many large schemas would cost many compiles (`mode="before"` validators)."""
    if isinstance(v, list):
        import json

        try:
            chars = len(json.dumps(v))
        except (TypeError, ValueError, RecursionError):
            return v  # the field's own validation says what is wrong
        if chars > LIMITS.chars:
            raise ValueError(f"the tools' definitions hold {chars} characters; the limit is {LIMITS.chars}")
    return v


class Tool(_Body):
    type: Literal["function"]
    function: Function


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: dict[str, str]


class Message(_Body):
    # a free-form role would be rendered into the chat template as is (and could forge a turn)
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Union[str, list[TextPart], None] = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # an assistant turn's thinking (llama-server's), for the template

    @field_validator("content")
    @classmethod
    def _text_and_images(cls, v):
        for part in v if isinstance(v, list) else ():
            if part.type in IMAGE_PART_TYPES:
                if not isinstance(part.url(), str) or not part.url():
                    raise ValueError(f'an {part.type} part needs \'image_url\': {{"url": "data:image/png;base64,..."}}')
            elif part.type != "text":
                raise ValueError(f"'{part.type}' parts are not supported (text and image_url are; audio is not)")
            elif part.text is None:
                raise ValueError("a text part needs a string 'text'")
        return v

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text or "" for p in self.content if p.type == "text")
        return self.content or ""

    def content_parts(self) -> Union[str, list[dict]]:
        """The content for the chat template: the text, or (with images) text and image parts in order."""
        if not isinstance(self.content, list) or all(p.type == "text" for p in self.content):
            return self.text()
        return [
            image_part(p.url(), f"an {p.type} part of a {self.role} message")
            if p.type in IMAGE_PART_TYPES
            else {"type": "text", "text": p.text}
            for p in self.content
        ]


class _NoTools(Sampling):
    """Routes without tool calls refuse `tools` instead of ignoring them."""

    tools: Any = None

    @field_validator("tools")
    @classmethod
    def _refused(cls, v):
        if v:
            raise ValueError("tool calls are served on /v1/chat/completions and /v1/responses, not on this route")
        return v


class PromptObject(_Body):
    """llama-server's `{"prompt_string": ..., "multimodal_data": [...]}` prompt."""

    prompt_string: str
    multimodal_data: list[str] | None = None


# a prompt, or a batch of them (llama-server's forms): a string, token ids, ids and strings mixed
# in one sequence, an object, or a list of any of these
PromptField = Union[str, PromptObject, list[Union[int, str, PromptObject, list[Union[int, str]]]]]


def _is_tag(part: Any) -> bool:
    """pydantic names the member of a union it tried ('str', 'list[int]') and validators in locs."""
    p = str(part)
    named_model = p[:1].isupper()  # a union member that is a model (PromptObject): fields are lowercase
    return (
        "[" in p
        or named_model
        or p in ("str", "int", "float", "bool", "none", "dict", "list")
        or p.startswith("function-")
    )


def describe(error: ValidationError) -> str:
    """One line for a 400: where (a dotted path) and what, never the client's whole value. For a
    value no member of a union accepts, the deepest complaint is the useful one (a bad list item
    rather than 'not a string'); at equal depth the alternatives are listed."""
    errors = error.errors()
    deepest = max(len(e["loc"]) for e in errors)
    first = next(e for e in errors if len(e["loc"]) == deepest)
    path = [p for p in first["loc"] if not _is_tag(p)]
    where = ".".join(str(p) for p in path)
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "literal_error" and where.endswith("role"):
        msg = f"must be one of {', '.join(ROLES)}"
    same = [e["msg"] for e in errors if [p for p in e["loc"] if not _is_tag(p)] == path and len(e["loc"]) == deepest]
    if len(same) > 1 and all(m.startswith("Input should be ") for m in same):
        msg = "Input should be " + " or ".join(dict.fromkeys(m.removeprefix("Input should be ") for m in same))
    return f"'{where}': {msg}" if where else msg


def refuse_unsupported(body: dict[str, Any], takes_n: bool = False) -> str | None:
    """The first field we cannot honour (n > 1 where a route has one choice...), as a message."""
    n = body.get("n")
    if not takes_n and n is not None and (type(n) is not int or n != 1):  # 1.0 and true are not the count 1
        return "'n' must be the integer 1 (one choice per request on this route)"
    for key in UNSUPPORTED:
        if body.get(key):
            return f"'{key}' is not supported by this server"
    return None


def grammar_spec(body: dict[str, Any]) -> GrammarSpec | None:
    """What a request constrains its output to: OpenAI's `response_format` (json_object,
    json_schema), llama-server's `json_schema` (a schema object) or `grammar` (GBNF text); None for
    free text. ValueError (a 400's message) for a malformed field, or a grammar that does not compile."""
    found: list[tuple[str, GrammarSpec]] = []
    fmt = body.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "json_object":
            schema = fmt.get("schema", {"type": "object"})  # llama-server also takes a schema here
            found.append(("response_format", GrammarSpec("json_schema", _schema_text(schema, "response_format"))))
        elif kind == "json_schema":
            inner = fmt.get("json_schema")
            schema = inner.get("schema") if isinstance(inner, dict) else None
            if not isinstance(schema, dict):
                raise ValueError("'response_format': json_schema needs a 'json_schema' object with a 'schema'")
            found.append(("response_format", GrammarSpec("json_schema", _schema_text(schema, "response_format"))))
        elif kind != "text":
            raise ValueError("'response_format': type must be text, json_object or json_schema")
    schema = body.get("json_schema")
    if schema is not None:  # ({}: any JSON)
        found.append(("json_schema", GrammarSpec("json_schema", _schema_text(schema, "json_schema"))))
    grammar = body.get("grammar")
    if grammar is not None and grammar != "":
        if not isinstance(grammar, str):
            raise ValueError("'grammar': must be a string (a GBNF grammar)")
        found.append(("grammar", GrammarSpec("gbnf", grammar)))
    if len(found) > 1:
        raise ValueError("only one of 'grammar', 'json_schema' and 'response_format' may constrain a request")
    if not found:
        return None
    key, spec = found[0]
    try:
        check_grammar(spec)
    except GrammarError as exc:
        raise ValueError(f"'{key}': {exc}") from None
    return spec


def _schema_text(schema: Any, key: str) -> str:
    import json

    if not isinstance(schema, dict):
        raise ValueError(f"'{key}': the schema must be a JSON object")
    return json.dumps(schema)
