"""llama-server's own bodies: `/completion`, `/tokenize`, `/detokenize`."""

from __future__ import annotations

from typing import Any, Union

from .common import PromptField, TopCount, _Body, _NoTools


class NativeCompletionRequest(_NoTools):
    """llama-server `POST /completion`."""

    prompt: PromptField
    n_probs: TopCount | None = None
    post_sampling_probs: bool = False  # completion_probabilities after the sampler chain, as probabilities
    return_tokens: bool = False


class InfillRequest(_NoTools):
    """llama-server `POST /infill`: text (or ids and text mixed) before and after the hole."""

    input_prefix: Union[str, list[Union[int, str]]]
    input_suffix: Union[str, list[Union[int, str]]]
    prompt: Union[str, list[Union[int, str]]] = ""
    input_extra: Any = None  # checked by infill.check_extra, in llama-server's words
    n_probs: TopCount | None = None
    return_tokens: bool = False


class TokenizeRequest(_Body):
    content: str
    add_special: bool = False
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    tokens: list[int]
