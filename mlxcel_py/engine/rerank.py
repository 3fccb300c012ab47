"""Relevance of a document to a query for a causal-LM reranker (serve's `/rerank`, llama-server's
`--reranking` on a model without a classification head): the model reads the judge prompt
(formats/rerank.py) and the score is the probability of "yes" against "no" as its next token,
sigmoid(logit_yes - logit_no), in [0, 1]. That is Qwen3-Reranker's own scoring (a softmax over
the two logits) and llama-server's logit-margin path.

The prompt goes through a fresh SequenceCache in the usual prefill chunks, the last token alone,
so the forward is the one generation runs and only one row's logits are read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def relevance(model: Any, ids: Sequence[int], yes: int, no: int, channel: Any = None) -> float:
    """P("yes") of the two answers after the prompt `ids` (non-empty)."""
    from .cache import SequenceCache

    cache = SequenceCache(model, channel)
    cache.prefill(list(ids[:-1]))
    row = cache.feed(list(ids[-1:]))[-1]
    margin = (row[yes] - row[no]).item()
    return 0.5 * (1.0 + math.tanh(margin / 2))  # the sigmoid, without overflow at any margin
