"""llama-server's own bodies: `/completion`, `/tokenize`, `/detokenize`."""

from __future__ import annotations

from .common import PromptField, TopCount, _Body, _NoTools


class NativeCompletionRequest(_NoTools):
    """llama-server `POST /completion`."""

    prompt: PromptField
    n_probs: TopCount | None = None
    return_tokens: bool = False


class TokenizeRequest(_Body):
    content: str
    add_special: bool = False
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    tokens: list[int]
