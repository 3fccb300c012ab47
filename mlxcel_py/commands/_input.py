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
