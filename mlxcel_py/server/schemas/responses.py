"""OpenAI Responses (`POST /v1/responses`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, field_validator

from .common import Function, Sampling, image_part, tools_within_limit

RESPONSE_ROLES = ("user", "system", "developer", "assistant")


class ResponsesTool(Function):
    """A Responses function tool: the function's fields at the top level."""

    type: Literal["function"]


class ResponsesRequest(Sampling):
    input: Union[str, Annotated[list[dict[str, Any]], Field(min_length=1)]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    tools: Annotated[list[ResponsesTool], Field(max_length=128)] | None = None
    tool_choice: Union[Literal["auto", "none", "required"], dict[str, Any], None] = None
    text: dict[str, Any] | None = None

    _tools_within_limit = field_validator("tools", mode="before")(tools_within_limit)

    @field_validator("input")
    @classmethod
    def _items(cls, v):
        if isinstance(v, str):
            if not v:
                raise ValueError("must be a non-empty string or a list of items")
            return v
        for i, item in enumerate(v):
            kind = item.get("type", "message")
            if kind == "message":
                if item.get("role") not in RESPONSE_ROLES:
                    raise ValueError(f"item {i}: role must be one of {', '.join(RESPONSE_ROLES)}")
                content = item.get("content")
                parts = content if isinstance(content, list) else None
                if not isinstance(content, str) and not (
                    parts is not None and all(isinstance(p, dict) and _part_ok(p) for p in parts)
                ):
                    raise ValueError(
                        f"item {i}: content must be a string or text and image parts "
                        "(input_text, output_text, input_image with an image_url)"
                    )
            elif kind == "function_call":
                if not isinstance(item.get("name"), str) or not isinstance(item.get("arguments", ""), str):
                    raise ValueError(f"item {i}: a function_call needs a string 'name' and 'arguments'")
            elif kind == "function_call_output":
                if not isinstance(item.get("output"), str):
                    raise ValueError(f"item {i}: a function_call_output needs a string 'output'")
            else:
                raise ValueError(
                    f"item {i}: type {kind!r} is not supported (message, function_call, function_call_output)"
                )
        return v

    def requested_tokens(self) -> int | None:
        return self.max_output_tokens if self.max_output_tokens is not None else super().requested_tokens()

    def tool_list(self) -> list[dict]:
        """The tools in the chat route's shape."""
        return [
            {"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type", "strict"})}
            for t in self.tools or []
        ]

    def choice(self) -> Any:
        c = self.tool_choice
        if isinstance(c, dict) and c.get("type") == "function":
            return {"type": "function", "function": {"name": c.get("name")}}
        if isinstance(c, dict):
            raise ValueError('\'tool_choice\': an object must be {"type": "function", "name": ...}')
        return c

    def format_fields(self) -> dict:
        """`text.format` as the chat route's `response_format`."""
        fmt = (self.text or {}).get("format") if isinstance(self.text, dict) else None
        if fmt is None:
            return {}
        if not isinstance(fmt, dict):
            return {"response_format": fmt}  # refused with the chat route's message
        if fmt.get("type") == "json_schema":
            return {"response_format": {"type": "json_schema", "json_schema": {"schema": fmt.get("schema")}}}
        return {"response_format": fmt}

    def turns(self) -> list[dict]:
        head = [{"role": "system", "content": self.instructions}] if self.instructions else []
        if isinstance(self.input, str):
            return head + [{"role": "user", "content": self.input}]
        out = head
        for item in self.input:
            kind = item.get("type", "message")
            if kind == "message":
                out.append({"role": item["role"], "content": _content(item["content"])})
            elif kind == "function_call":
                call = {
                    "id": item.get("call_id") or "",
                    "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments", "")},
                }
                if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                    out[-1]["tool_calls"].append(call)
                else:
                    out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            else:
                out.append({"role": "tool", "tool_call_id": item.get("call_id") or "", "content": item["output"]})
        return out


def _part_ok(p: dict) -> bool:
    if p.get("type") == "input_image":
        return isinstance(p.get("image_url"), str) and bool(p["image_url"])
    return isinstance(p.get("text"), str)


def _content(c: Any) -> Any:
    """A message item's content for the template: its text, or text and image parts in order."""
    if isinstance(c, str):
        return c
    if not any(p.get("type") == "input_image" for p in c):
        return "".join(p["text"] for p in c)
    return [
        image_part(p["image_url"], "an input_image part")
        if p.get("type") == "input_image"
        else {"type": "text", "text": p["text"]}
        for p in c
    ]
