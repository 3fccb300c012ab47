"""Text -> prompt token ids: chat template (default), optional system message, or raw text; and
the check that refuses text too long for the context window before it is tokenized."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# Command R7B opens its reply with a thinking span it does not open in the template
_R7B_REPLY, _R7B_NO_THINKING = "<|CHATBOT_TOKEN|>", "<|START_THINKING|><|END_THINKING|>"


# what marks a template that can think: llama.cpp's test renders it and looks for a reasoning span
_THINKING_MARKS = (THINK_OPEN, "<|START_THINKING|>", "<seed:think>", "[THINK]", "enable_thinking", "reasoning_content")


_READS_FUNCTIONS = re.compile(r"\+\s*functions\b|\{\{-?\s*functions\b")


def supports_thinking(source: str) -> bool:
    return any(mark in source for mark in _THINKING_MARKS)


def template_extras(source: str, now: datetime | None = None, tools: list[dict] | None = None) -> dict:
    """What llama.cpp's renderer passes a template beside the messages, where the template reads
    it: today's date as Llama 3.x templates print it (`date_string`, else they print a fixed
    "26 Jul 2024") and as FireFunction's does (`datetime`); `enable_thinking`, which llama-server
    always passes (under `--reasoning auto`: whether the template can think, so DeepSeek R1's
    `{% if not enable_thinking %}</think>` leaves the block open; on/off and a request's
    chat_template_kwargs override it); FireFunction's `functions` (the tools as indented JSON, or
    "", as llama.cpp's FireFunction format passes them). transformers' renderer already gives
    `strftime_now`."""
    now = now or datetime.now()
    extra: dict = {"enable_thinking": True} if supports_thinking(source) else {}
    if "date_string" in source:
        extra["date_string"] = now.strftime("%d %b %Y")
    if "datetime" in source:
        extra["datetime"] = now.strftime("%b %d %Y %H:%M:%S GMT")
    if _READS_FUNCTIONS.search(source):
        extra["functions"] = json.dumps(tools, indent=2) if tools else ""
    return extra


def no_thinking_suffix(prompt_tail: str, source: str) -> str:
    """Text that closes a reply's thinking before it starts, for a prompt rendered with
    `enable_thinking: false` (llama-server's `--reasoning off`): a template that opens a think
    block itself (DeepSeek R1, QwQ) gets it closed; Command R7B gets its empty thinking span.
    Templates that read `enable_thinking` (Qwen3) close it themselves: nothing is added."""
    if prompt_tail.rstrip().endswith(THINK_OPEN):
        return THINK_CLOSE
    if prompt_tail.endswith(_R7B_REPLY) and "<|START_THINKING|>" in source:
        return _R7B_NO_THINKING
    return ""


def render_messages(
    tokenizer,
    messages: Sequence[dict],
    *,
    chat_template: bool = True,
    continue_last: bool = False,
    add_generation_prompt: bool = True,
    tools: list[dict] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids for a conversation that ends with the user's turn, ready for the reply; with
    `continue_last` it ends with an assistant turn the reply continues (a prefill: its text is
    left open, with no end-of-turn after it). `extra`: more variables for the template
    (`enable_thinking`, a request's `chat_template_kwargs`); `enable_thinking: false` also
    closes a think block the template opens (no_thinking_suffix)."""
    if chat_template and getattr(tokenizer, "has_chat_template", False):
        source = template_source(tokenizer)
        kwargs = {**template_extras(source, tools=tools), **(extra or {})}
        if tools:
            kwargs["tools"] = tools
        if continue_last:
            return _apply_template(tokenizer, list(messages), continue_final_message=True, **kwargs)
        ids = _apply_template(tokenizer, list(messages), add_generation_prompt=add_generation_prompt, **kwargs)
        if add_generation_prompt and kwargs.get("enable_thinking") is False:
            suffix = no_thinking_suffix(tokenizer.decode(ids[-32:]), source)
            ids += tokenizer.encode(suffix, add_special_tokens=False) if suffix else []
        return ids
    if chat_template:
        # no template in the checkpoint: mlxcel's pseudo-template
        turns = "".join(
            f"{m['role'].capitalize()}: {m['content']}\n\n" for m in messages[: len(messages) - continue_last]
        )
        if continue_last:
            text = turns + "Assistant: " + messages[-1]["content"]
        else:
            text = turns + ("Assistant:" if add_generation_prompt else "")
    else:
        text = "\n".join(m["content"] for m in messages)
    return list(tokenizer.encode(text))


def _apply_template(tokenizer: Any, messages: list[dict], **kwargs: Any) -> list[int]:
    """The template's token ids. mlx-lm's TokenizerWrapper tells every template
    `enable_thinking=<whether the vocabulary has <think>>` when the caller says nothing, where
    llama-server leaves it to the template's own default (`--reasoning auto`): when that is all the
    wrapper would add (a template of the tokenizer's, no renderer of mlx-lm's own), render through
    the wrapped tokenizer."""
    inner = getattr(tokenizer, "_tokenizer", None)
    if not messages:
        # transformers refuses an empty conversation, where llama-server renders it (the template's
        # default system turn, its generation prompt); one empty conversation in a batch renders
        target = inner if inner is not None else tokenizer
        return list(target.apply_chat_template([[]], tokenize=True, return_dict=False, **kwargs)[0])
    if (
        inner is not None
        and "enable_thinking" not in kwargs
        and getattr(tokenizer, "_chat_template", None) is None
        and getattr(tokenizer, "_thinking_kwarg", "enable_thinking") == "enable_thinking"
    ):
        return list(inner.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs))
    return list(tokenizer.apply_chat_template(messages, **kwargs))


def leading_bos(tokenizer: Any) -> int | None:
    """The BOS id the tokenizer puts before a whole prompt (a post-processor's doing: transformers
    ignores tokenizer_config's add_bos_token once there is a tokenizer.json), else None."""
    bos = getattr(tokenizer, "bos_token_id", None)
    try:
        return bos if bos is not None and list(tokenizer.encode("a"))[:1] == [bos] else None
    except Exception:
        return None


def template_source(tokenizer: Any) -> str:
    """The model's chat template as text ("" without one)."""
    template = getattr(tokenizer, "chat_template", None)
    if template is None:
        template = getattr(getattr(tokenizer, "_tokenizer", None), "chat_template", None)
    if isinstance(template, dict):  # named templates: the default one, or any
        template = template.get("default") or next(iter(template.values()), "")
    return template if isinstance(template, str) else ""


def longest_token_chars(tokenizer: Any) -> int:
    """Characters of the vocabulary's longest entry (a huge number where there is no listing)."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # a tokenizer without a vocabulary listing: no bound from it
        return 1 << 30
    return max((len(k) for k in vocab), default=1 << 30) or 1 << 30


def beyond_any_tokenization(chars: int, context_length: int, longest: int) -> bool:
    """Whether `chars` characters of text cannot fit `context_length` tokens in any tokenization:
    no token is longer than the vocabulary's longest entry. Checked before tokenizing, which for
    a 50 MB prompt took 48 s and 6 GB only to refuse it."""
    return chars > context_length * longest


def prompt_ids(tokenizer, prompt: str, *, system: str | None = None, chat_template: bool = True) -> list[int]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return render_messages(tokenizer, messages, chat_template=chat_template)
