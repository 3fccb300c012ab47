"""Whether a text is a whole number in ASCII digits: what `int()` reads back.

Why not `str.isdigit`: it also takes other digits ("²", "٣"), which `int()` refuses with a
ValueError, and such text comes from users and clients (environment variables, HTTP headers,
JSON keys). Every place that checks a text before `int()` asks here.
"""

from __future__ import annotations


def whole_number(text: str) -> bool:
    """True for one or more of 0-9 and nothing else (no sign, no spaces)."""
    return text.isascii() and text.isdigit()
