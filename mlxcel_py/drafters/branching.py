"""Draft trees from a model drafter's own logits (engine/tree.py): where its first and second
choices are close, both become branches.

- `runner_ups`: for drafters whose each step reads their own previous pick (a full draft model,
  an MTP head, EAGLE-3): each step's runner-ups (its top tokens after the pick) become leaves
  beside the chain's token. A node below a runner-up would need another drafter forward, so it
  stays a leaf (mlxcel's MTP tree: MLXCEL_MTP_TREE_BRANCHES runner-up leaves,
  MLXCEL_MTP_TREE_MARGIN gap gate).
- `best_first`: for drafters whose every position's distribution comes from one forward,
  independent of the tokens before it (DFlash's block): any node can take children from the next
  position's top tokens, expanded best first by the path's probability (DDTree, arXiv 2604.12989).

Both keep the greedy chain as the tree's first chain and list the other nodes best first (by the
drafter's probability of the whole path), so the engine's node budget keeps the likeliest; a
branch is offered only where the logit gap to the chain's token is below `margin`.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence

import mlx.core as mx

from ..engine.tree import DraftTree

TOP = 4  # candidates a step or position offers: its best and three runner-ups


def _top(logits: mx.array, k: int) -> tuple[list[list[int]], list[list[float]], list[list[float]]]:
    """Each row's k best token ids, best first, with their logits and log-probabilities."""
    k = min(k, logits.shape[-1])
    idx = mx.argpartition(-logits, kth=k - 1, axis=-1)[:, :k]
    val = mx.take_along_axis(logits, idx, axis=-1)
    order = mx.argsort(-val, axis=-1)
    idx, val = mx.take_along_axis(idx, order, axis=-1), mx.take_along_axis(val, order, axis=-1)
    lp = val - mx.logsumexp(logits, axis=-1, keepdims=True)
    mx.eval(idx, val, lp)
    return idx.tolist(), val.tolist(), lp.tolist()


def runner_ups(tokens: Sequence[int], steps: Sequence[mx.array], margin: float) -> DraftTree | None:
    """The chain `tokens` (each step's argmax of `steps`, (1, V) logits rows) and, as leaves
    beside each, that step's runner-ups whose logits are within `margin` of the pick's, best
    first by the probability of the path to them; None when no step offers one."""
    if not tokens:
        return None
    idx, val, lp = _top(mx.concatenate(list(steps[: len(tokens)]), axis=0).astype(mx.float32), TOP)
    leaves = []  # (log-probability of the path to the leaf, step, token)
    prefix = 0.0
    for i, t in enumerate(tokens):
        if idx[i][0] != t:  # the pick is not this step's argmax (a tie): no branches from here
            break
        leaves += [(prefix + lp[i][r], i, idx[i][r]) for r in range(1, len(idx[i])) if val[i][0] - val[i][r] < margin]
        prefix += lp[i][0]
    if not leaves:
        return None
    leaves.sort(key=lambda x: -x[0])
    return DraftTree(
        tuple(tokens) + tuple(t for _, _, t in leaves),
        tuple(range(-1, len(tokens) - 1)) + tuple(i - 1 for _, i, _ in leaves),
    )


def best_first(tokens: Sequence[int], logits: mx.array, nodes: int, margin: float) -> DraftTree | None:
    """The chain `tokens` (the argmax of each row of `logits` (k, V), one row per position) and
    up to `nodes` more nodes: any node at depth d may have children from row d's top tokens,
    taken best first by the path's summed log-probability, each within `margin` of its row's
    best logit."""
    k = len(tokens)
    if not k or nodes <= 0:
        return None
    idx, val, lp = _top(logits[:k].astype(mx.float32), TOP)
    if any(idx[d][0] != tokens[d] for d in range(k)):
        return None  # a tie picked another argmax: keep the chain
    chain_lp = [0.0]
    for d in range(k):
        chain_lp.append(chain_lp[-1] + lp[d][0])
    parents = list(range(-1, k - 1))
    out = list(tokens)
    heap: list[tuple[float, int, int, int]] = []  # (-path log-prob, order offered, parent node, row * TOP + rank)
    order = itertools.count()

    def offer(parent: int, d: int, base: float, skip_best: bool) -> None:
        """Row d's candidates as children of `parent` (a node at depth d, -1: the root)."""
        if d >= k:
            return
        for r in range(1 if skip_best else 0, len(idx[d])):
            if val[d][0] - val[d][r] >= margin or math.isinf(lp[d][r]):
                continue
            heapq.heappush(heap, (-(base + lp[d][r]), next(order), parent, d * TOP + r))

    for d in range(k):  # beside every chain node: its row's other candidates
        offer(d - 1, d, chain_lp[d], True)
    added = 0
    while heap and added < nodes:
        neg, _, parent, code = heapq.heappop(heap)
        d, r = divmod(code, TOP)
        out.append(idx[d][r])
        parents.append(parent)
        added += 1
        offer(len(out) - 1, d + 1, -neg, False)
    return DraftTree(tuple(out), tuple(parents)) if added else None
