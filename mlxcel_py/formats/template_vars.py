"""The variables every chat template gets beside the messages, from serve's flags (llama-server's
`--reasoning`, `--reasoning-budget`, `--chat-template-kwargs`): checked before any model loads,
handed to the server's request reader. A request's own `chat_template_kwargs` add to them."""

from __future__ import annotations

import json

from ..errors import UsageError
from ..options import ServerOptions

REASONING_MODES = ("on", "off", "auto")
# transformers' apply_chat_template parameters (and the messages): a template variable of one of
# these names would not reach the template but change the call (`tokenize: false` returns text)
RESERVED = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


def reserved_in(kwargs: dict) -> str | None:
    """What is wrong with template variables given as `kwargs` (None: nothing)."""
    taken = sorted(k for k in kwargs if k in RESERVED)
    if taken:
        return f"{', '.join(taken)} cannot be set as template variables (they are the renderer's own arguments)"
    return None


def check(srv: ServerOptions) -> None:
    """--reasoning, --reasoning-budget and --chat-template-kwargs (llama-server's): what a chat
    template is told beside the messages."""
    if srv.reasoning not in REASONING_MODES:
        raise UsageError(f"--reasoning {srv.reasoning} is not one of {', '.join(REASONING_MODES)}")
    if srv.reasoning_budget < -1:
        raise UsageError(
            f"--reasoning-budget must be -1 (unlimited), 0 (no thinking) or a number of tokens, got {srv.reasoning_budget}"
        )
    if srv.reasoning_budget == 0 and srv.reasoning == "on":
        raise UsageError("--reasoning on and --reasoning-budget 0 contradict each other: drop one")
    server_kwargs(srv)


def server_kwargs(srv: ServerOptions) -> dict:
    """The variables every chat template gets: --chat-template-kwargs, then --reasoning's
    enable_thinking (on: true; off or --reasoning-budget 0: false; auto: the template's default)."""
    kwargs: dict = {}
    if srv.chat_template_kwargs is not None:
        try:
            kwargs = json.loads(srv.chat_template_kwargs)
        except ValueError as exc:
            raise UsageError(
                f"--chat-template-kwargs is not JSON ({exc}); give an object such as '{{\"a\": 1}}'"
            ) from None
        if not isinstance(kwargs, dict):
            raise UsageError("--chat-template-kwargs must be a JSON object of the template's variables")
        if (why := reserved_in(kwargs)) is not None:
            raise UsageError(f"--chat-template-kwargs: {why}")
    if srv.reasoning == "off" or srv.reasoning_budget == 0:
        kwargs["enable_thinking"] = False
    elif srv.reasoning == "on":
        kwargs["enable_thinking"] = True
    return kwargs
