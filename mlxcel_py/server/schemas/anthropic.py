"""Anthropic Messages (`POST /v1/messages`, `/v1/messages/count_tokens`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, field_validator

from .common import Sampling, _Body, _bounded_stops, image_part, schema_that_compiles, tools_within_limit


class AnthropicBlock(_Body):
    """A content block: text, or (tool calls) tool_use in an assistant turn, tool_result in a user turn."""

    type: str
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None  # tool_use
    input: dict[str, Any] | None = None  # tool_use
    tool_use_id: str | None = None  # tool_result
    content: Union[str, list[dict[str, Any]], None] = None  # tool_result: a string or text blocks
    is_error: bool | None = None  # tool_result
    thinking: str | None = None  # thinking: the model's reasoning, kept for the template
    signature: str | None = None  # thinking (opaque; not checked here)
    data: str | None = None  # redacted_thinking (opaque: nothing a template can read)
    source: dict[str, Any] | None = None  # image: {"type": "base64", "media_type", "data"} or {"type": "url", "url"}

    def result_text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(b.get("text", "") for b in self.content or [] if isinstance(b.get("text", ""), str))

    def result_parts(self) -> Union[str, list[dict]]:
        """A tool result's content for the template: its text, or text and image parts in order."""
        blocks = self.content if isinstance(self.content, list) else []
        if not any(b.get("type") == "image" for b in blocks):
            return self.result_text()
        return [
            image_part(image_url(b.get("source")), "an image in a tool_result")
            if b.get("type") == "image"
            else {"type": "text", "text": b.get("text") or ""}
            for b in blocks
        ]


def image_url(source: Any) -> str:
    """An Anthropic image source as a URL (base64 data becomes a data: URL)."""
    if not isinstance(source, dict):
        raise ValueError("an image block needs a 'source' object")
    if source.get("type") == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise ValueError("a base64 image source needs 'media_type' and 'data' strings")
        return f"data:{media};base64,{data}"
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return source["url"]
    raise ValueError("an image source must be {'type': 'base64', ...} or {'type': 'url', 'url': ...}")


class AnthropicMessage(_Body):
    role: Literal["user", "assistant"]
    content: Union[str, list[AnthropicBlock]]

    @field_validator("content")
    @classmethod
    def _text_blocks(cls, v):
        for block in v if isinstance(v, list) else ():
            if block.type == "text":
                if block.text is None:
                    raise ValueError("a text block needs a string 'text'")
            elif block.type == "tool_use":
                if not block.name or block.input is None:
                    raise ValueError("a tool_use block needs 'name' and an 'input' object")
            elif block.type == "tool_result":
                if not block.tool_use_id:
                    raise ValueError("a tool_result block needs 'tool_use_id'")
                parts = block.content if isinstance(block.content, list) else []
                kinds = sorted({str(p.get("type")) for p in parts if p.get("type") not in (None, "text", "image")})
                if kinds:
                    raise ValueError(
                        f"a tool_result holds {', '.join(kinds)} content; this server reads text and images"
                    )
                for p in parts:
                    if p.get("type") == "image":
                        image_url(p.get("source"))
            elif block.type == "image":
                image_url(block.source)
            elif block.type == "thinking":
                if not isinstance(block.thinking, str):
                    raise ValueError("a thinking block needs a string 'thinking'")
            elif block.type != "redacted_thinking":
                raise ValueError(
                    f"'{block.type}' blocks are not supported (text, image, tool_use, tool_result, thinking)"
                )
        return v

    def reasoning(self) -> str:
        """The thinking blocks' text (an assistant turn's reasoning, as `reasoning_content`)."""
        if isinstance(self.content, str):
            return ""
        return "".join(b.thinking or "" for b in self.content if b.type == "thinking")

    def text(self) -> str:
        return (
            self.content
            if isinstance(self.content, str)
            else "".join(b.text or "" for b in self.content if b.type == "text")
        )

    def turns(self) -> list[dict]:
        """This message as chat turns: tool results become `tool` turns, tool uses the assistant's calls."""
        if isinstance(self.content, str):
            return [{"role": self.role, "content": self.content}]
        out: list[dict] = []
        for b in self.content:
            if b.type == "tool_result":
                out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": b.result_parts()})
        calls = [
            {"id": b.id or "", "type": "function", "function": {"name": b.name, "arguments": b.input}}
            for b in self.content
            if b.type == "tool_use"
        ]
        text, thought = self.text(), self.reasoning()
        if any(b.type == "image" for b in self.content):  # text and images, in their order
            text = [
                image_part(image_url(b.source), f"an image block of a {self.role} message")
                if b.type == "image"
                else {"type": "text", "text": b.text}
                for b in self.content
                if b.type in ("image", "text")
            ]
        if text or calls or thought or not out:
            out.append(
                {"role": self.role, "content": text}
                | ({"tool_calls": calls} if calls else {})
                | ({"reasoning_content": thought} if thought else {})
            )
        return out


class AnthropicTool(_Body):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    input_schema: dict[str, Any]

    @field_validator("input_schema")
    @classmethod
    def _compiles(cls, v):
        return schema_that_compiles(v)


class AnthropicRequest(Sampling):
    """Anthropic `POST /v1/messages`: `max_tokens` is required, `system` is its own field, stops
    are `stop_sequences`; `tools` with `tool_choice` (auto, any, tool, none)."""

    max_tokens: int
    messages: list[AnthropicMessage]  # empty is taken, as llama-server takes it (prompting renders it)
    system: Union[str, list[AnthropicBlock], None] = None
    stop_sequences: list[str] | None = None
    tools: Annotated[list[AnthropicTool], Field(max_length=128)] | None = None
    tool_choice: dict[str, Any] | None = None
    # {"type": "enabled", "budget_tokens": N}: the reply's thinking capped at N tokens, as
    # llama-server maps it (to thinking_budget_tokens; 10000 when N is left out)
    thinking: dict[str, Any] | None = None

    _tools_within_limit = field_validator("tools", mode="before")(tools_within_limit)

    @field_validator("thinking")
    @classmethod
    def _thinking(cls, v):
        if v is None:
            return v
        if v.get("type") not in ("enabled", "disabled", "adaptive"):
            raise ValueError("'thinking': type must be enabled, disabled or adaptive")
        n = v.get("budget_tokens")
        if n is not None and (type(n) is not int or n < 0):
            raise ValueError("'thinking': budget_tokens must be a whole number of 0 or more")
        return v

    def thinking_budget(self) -> int | None:
        if self.thinking is not None and self.thinking.get("type") == "enabled":
            return self.thinking.get("budget_tokens", 10000)
        return super().thinking_budget()

    @field_validator("stop_sequences")
    @classmethod
    def _bounded_stop_sequences(cls, v):
        return _bounded_stops(v)

    def stops(self) -> list[str]:
        return [s for s in self.stop_sequences or [] if s] + super().stops()

    def turns(self) -> list[dict]:
        return anthropic_turns(self.system, self.messages)

    def tool_list(self) -> list[dict]:
        """The tools in the chat route's shape."""
        return [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description or "", "parameters": t.input_schema},
            }
            for t in self.tools or []
        ]

    def choice(self) -> Any:
        """tool_choice in the chat route's terms (ValueError for one Anthropic does not define)."""
        c = self.tool_choice
        if c is None:
            return None
        kind = c.get("type")
        if kind in ("auto", "none"):
            return kind
        if kind == "any":
            return "required"
        if kind == "tool" and isinstance(c.get("name"), str):
            return {"type": "function", "function": {"name": c["name"]}}
        raise ValueError("'tool_choice': type must be auto, any, tool (with a 'name') or none")


class AnthropicCountRequest(_Body):
    model: str | None = None
    messages: list[AnthropicMessage]  # empty is taken, as llama-server takes it (prompting renders it)
    system: Union[str, list[AnthropicBlock], None] = None
    tools: Annotated[list[AnthropicTool], Field(max_length=128)] | None = None

    _tools_within_limit = field_validator("tools", mode="before")(tools_within_limit)
    tool_list = AnthropicRequest.tool_list

    def turns(self) -> list[dict]:
        return anthropic_turns(self.system, self.messages)


def anthropic_turns(system: str | list[AnthropicBlock] | None, messages: list[AnthropicMessage]) -> list[dict]:
    """{role, content} turns for the chat template: `system` (a string or text blocks) first."""
    text = system if isinstance(system, str) else "".join(b.text or "" for b in system or [])
    head = [{"role": "system", "content": text}] if text else []
    return head + [t for m in messages for t in m.turns()]
