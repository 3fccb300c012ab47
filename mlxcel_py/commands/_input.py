"""Text the user typed or piped, made safe for a tokenizer: invalid UTF-8 becomes U+FFFD.

Python hands invalid bytes in argv (and, with surrogateescape, on stdin) over as lone
surrogates, which the tokenizer refuses with a TypeError from deep in the chat template: one bad
byte in a chat line ended the whole session. Here they are replaced, with one warning per source,
so the line still goes through and the user knows what the model saw.
"""

from __future__ import annotations

import re
from collections.abc import Callable

REPLACEMENT = "\ufffd"
_STRAY = re.compile("[\ud800-\udc7f\udd00-\udfff]")


def clean(text: str, source: str, warn: Callable[[str], None]) -> str:
    """`text` with every invalid byte (a lone surrogate) replaced by U+FFFD; warns once if any."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    # a surrogate that never was a byte (a stray UTF-16 half) is replaced as it is; the escaped
    # bytes (U+DC80..U+DCFF) go back to bytes and decode with replacement
    fixed = _STRAY.sub(REPLACEMENT, text).encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    warn(f"{source}: invalid UTF-8 replaced with {REPLACEMENT!r} (U+FFFD)")
    return fixed


def read_images(paths, flag: str = "--image") -> list:
    """Image files, decoded and checked (vision.images) before any model loads."""
    if not paths:
        return []
    from ..vision.images import read_image_file

    return [read_image_file(p, flag) for p in paths]


def vision_of(session, flag: str = "--image"):
    """The loaded model's vision side, or a one-line refusal naming the flag."""
    from ..errors import UsageError

    vision = session.target.vision
    if vision is None:
        raise UsageError(
            f"{flag}: {session.target.resolved.named} is a text model (its config.json declares no vision "
            "tower mlx-vlm takes); pass a vision-language model with -m"
        )
    return vision


def with_images(images: list, text: str):
    """A user message's content: the text alone, or image parts (holding the images) and the text."""
    if not images:
        return text
    return [{"type": "image", "image": img} for img in images] + [{"type": "text", "text": text}]


def conversation_ids(session, messages: list[dict], chat_template: bool = True) -> list[int]:
    """A conversation's token ids; through the vision model's processor once any turn holds an image."""
    from ..formats.prompting import render_messages

    images = [p["image"] for m in messages if isinstance(m["content"], list) for p in m["content"] if "image" in p]
    if not images:
        return render_messages(session.tokenizer, messages, chat_template=chat_template)
    vision = vision_of(session, "/image")
    if not chat_template:
        return vision.encode("".join(vision.flat(m["content"]) for m in messages), images)
    return vision.conversation_ids(session.tokenizer, messages)
