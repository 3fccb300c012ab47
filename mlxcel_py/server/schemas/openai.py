"""OpenAI's chat and text completion bodies (`/v1/chat/completions`, `/v1/completions`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, field_validator

from .common import (
    Choices,
    Message,
    NamedToolChoice,
    PromptField,
    Sampling,
    Tool,
    TopCount,
    _NoTools,
    tools_within_limit,
)


class ChatRequest(Sampling):
    """OpenAI `POST /v1/chat/completions`."""

    messages: Annotated[list[Message], Field(min_length=1)]
    n: Choices = 1
    logprobs: bool | None = None
    top_logprobs: TopCount | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: Union[Literal["auto", "none", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: bool | None = None

    _tools_within_limit = field_validator("tools", mode="before")(tools_within_limit)

    def tool_list(self) -> list[dict]:
        return [t.model_dump(exclude_none=True) for t in self.tools or []]

    def choice(self) -> Any:
        """tool_choice in the shape every route's tools take (`RequestReader.tools`)."""
        c = self.tool_choice
        return c.model_dump() if isinstance(c, NamedToolChoice) else c


class CompletionRequest(_NoTools):
    """OpenAI `POST /v1/completions`: a string, a one-string list, or token ids."""

    prompt: PromptField
    n: Choices = 1
    logprobs: TopCount | None = None
