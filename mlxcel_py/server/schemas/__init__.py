"""Request bodies of every route, as pydantic models (strict types, unknown fields allowed).

Strict: a string is not a number, a bool is not an integer, NaN and Infinity are not numbers.
Unknown fields pass (OpenAI and llama-server clients send many we do not use); the ones that would
change what a response means and that we cannot honour are refused by name in `refuse_unsupported`.
Range checks that depend on the model (token ids within the vocabulary, prompt within the window)
and the sampling ranges (the CLI's own `validate.check_sampling`) run in the routes.

Split by API family as the routes are: `common` (what every body shares, and the helpers routes
use on any body), `openai`, `native` (llama-server's), `responses`, `anthropic`.
"""

from .anthropic import AnthropicBlock, AnthropicCountRequest, AnthropicMessage, AnthropicRequest, AnthropicTool
from .common import (
    MAX_CHOICES,
    MAX_STOP_CHARS,
    MAX_STOPS,
    ROLES,
    Message,
    PromptObject,
    Sampling,
    Tool,
    describe,
    grammar_spec,
    refuse_unsupported,
    schema_that_compiles,
    tools_within_limit,
)
from .native import DetokenizeRequest, InfillRequest, NativeCompletionRequest, TokenizeRequest
from .openai import ChatRequest, CompletionRequest
from .responses import ResponsesRequest, ResponsesTool

__all__ = [
    "MAX_CHOICES",
    "MAX_STOPS",
    "MAX_STOP_CHARS",
    "ROLES",
    "AnthropicBlock",
    "AnthropicCountRequest",
    "AnthropicMessage",
    "AnthropicRequest",
    "AnthropicTool",
    "ChatRequest",
    "CompletionRequest",
    "DetokenizeRequest",
    "Message",
    "InfillRequest",
    "NativeCompletionRequest",
    "PromptObject",
    "ResponsesRequest",
    "ResponsesTool",
    "Sampling",
    "TokenizeRequest",
    "Tool",
    "describe",
    "grammar_spec",
    "refuse_unsupported",
    "schema_that_compiles",
    "tools_within_limit",
]
