"""Text -> prompt token ids: chat template (default), optional system message, or raw text."""

from __future__ import annotations

from collections.abc import Sequence


def render_messages(tokenizer, messages: Sequence[dict], *, chat_template: bool = True) -> list[int]:
    """Token ids for a conversation that ends with the user's turn, ready for the reply."""
    if chat_template and getattr(tokenizer, "has_chat_template", False):
        return list(tokenizer.apply_chat_template(list(messages), add_generation_prompt=True))
    if chat_template:
        # no template in the checkpoint: mlxcel's pseudo-template
        text = "".join(f"{m['role'].capitalize()}: {m['content']}\n\n" for m in messages) + "Assistant:"
    else:
        text = "\n".join(m["content"] for m in messages)
    return list(tokenizer.encode(text))


def prompt_ids(tokenizer, prompt: str, *, system: str | None = None, chat_template: bool = True) -> list[int]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return render_messages(tokenizer, messages, chat_template=chat_template)
