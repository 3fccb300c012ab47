"""Text -> prompt token ids: chat template (default), optional system message, or raw text; and
the check that refuses text too long for the context window before it is tokenized."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def render_messages(
    tokenizer, messages: Sequence[dict], *, chat_template: bool = True, continue_last: bool = False
) -> list[int]:
    """Token ids for a conversation that ends with the user's turn, ready for the reply; with
    `continue_last` it ends with an assistant turn the reply continues (a prefill: its text is
    left open, with no end-of-turn after it)."""
    if chat_template and getattr(tokenizer, "has_chat_template", False):
        if continue_last:
            return list(tokenizer.apply_chat_template(list(messages), continue_final_message=True))
        return list(tokenizer.apply_chat_template(list(messages), add_generation_prompt=True))
    if chat_template:
        # no template in the checkpoint: mlxcel's pseudo-template
        turns = "".join(
            f"{m['role'].capitalize()}: {m['content']}\n\n" for m in messages[: len(messages) - continue_last]
        )
        text = turns + ("Assistant: " + messages[-1]["content"] if continue_last else "Assistant:")
    else:
        text = "\n".join(m["content"] for m in messages)
    return list(tokenizer.encode(text))


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
