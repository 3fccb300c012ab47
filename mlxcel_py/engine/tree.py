"""Draft trees: several candidate continuations verified in one target forward.

A chain proposes one token at each future depth; a tree spends some verify rows on alternatives
(a second earlier match's continuation, a drafter's runner-up). `DraftTree` holds the nodes in
topological order: node i's token and its parent (-1: the root, which is the last committed
token, row 0 of the verify block). Node i is row 1 + i.

How a tree goes through the target (`layout`): every row is its own entry of the ragged forward
(engine/batch.py), rotated at the position of its depth after the context, written at its own
buffer row (fed + row) and attending the context, then its ancestors' rows and its own, in depth
order: the keys, in the order, that the one-token step of its path attends. On the row-exact
kernel (csrc/, "Tree rows") each node's logits are that step's bit for bit, so the tree's
accepted path is what plain greedy decoding produces. A row whose ancestors are exactly the rows
before it (the tree's first chain) is laid out as an ordinary prefix.

What is kept (`accept` in verify.py, then SequenceCache.keep_rows): the longest root-to-node
path whose tokens equal the target's own choices, plus the target's token after it; the caches
keep the root and the path's rows, moved down to consecutive positions, so the next round sees
the state a chain would have left.

Where: only where every layer keeps plain KV caches and the forward is ragged (batch.why_no_trees):
a recurrent state (Gated DeltaNet, Mamba) or a rotating window cannot follow several branches in
one forward, and the float32 path has no per-row attention. Greedy only: the lossless argument
for sampled drafts covers one candidate per depth (verify.py), so sampled requests draft chains.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class DraftTree:
    tokens: tuple[int, ...]
    parents: tuple[int, ...]  # parents[i] < i, or -1 (the root: the last committed token)

    def __post_init__(self):
        if len(self.tokens) != len(self.parents):
            raise ValueError("a draft tree needs one parent per token")
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(f"node {i}'s parent {p} is not an earlier node or the root")

    @staticmethod
    def chain(tokens: Sequence[int]) -> DraftTree:
        return DraftTree(tuple(tokens), tuple(range(-1, len(tokens) - 1)))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> list[int]:
        """Depth of every node (a child of the root is at depth 1)."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return out

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    @property
    def chain_length(self) -> int:
        """How many nodes the first chain has (nodes 0, 1, ... each the child of the one before)."""
        n = 0
        while n < len(self.parents) and self.parents[n] == n - 1:
            n += 1
        return n

    def path(self, node: int) -> list[int]:
        """The nodes from the root's child down to `node`."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def children(self) -> list[list[int]]:
        """Each node's children, and the root's last (index -1)."""
        kids: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, p in enumerate(self.parents):
            kids[p].append(i)
        return kids

    def walk(self, choose: Callable[[int, list[int]], int]) -> tuple[list[int], int]:
        """The longest root-to-node path whose every token is the target's choice after its
        parent, and the target's choice after the path. `choose(row, path_tokens)` is the target's
        token at verify row `row` (0 the root, 1 + i node i) after the path's tokens."""
        kids = self.children()
        path: list[int] = []
        row = 0
        while True:
            want = choose(row, [self.tokens[n] for n in path])
            nxt = next((c for c in kids[row - 1] if self.tokens[c] == want), None)
            if nxt is None:
                return path, want
            path.append(nxt)
            row = nxt + 1

    def ended(self, stops: Callable[[int], bool]) -> DraftTree:
        """Without the nodes below a stopping token (EOS: decoding ends there, so nodes after it
        only widen the block)."""
        dead = set()
        for i, p in enumerate(self.parents):
            if p in dead or (p >= 0 and stops(self.tokens[p])):
                dead.add(i)
        return self._keep([i for i in range(len(self)) if i not in dead])

    def _keep(self, nodes: Sequence[int]) -> DraftTree:
        """The tree of `nodes` (increasing, each with its parent)."""
        new = {old: i for i, old in enumerate(nodes)}
        return DraftTree(
            tuple(self.tokens[i] for i in nodes),
            tuple(-1 if self.parents[i] < 0 else new[self.parents[i]] for i in nodes),
        )

    def sized(self, chain: int, extra: int, depth: int) -> DraftTree:
        """What a round verifies: the first chain cut to `chain` nodes (the policy's size of the
        proposal), then up to `extra` other nodes at most `depth` deep, each only with its parent
        (builders list nodes best first, so these are the best ones)."""
        kept: list[int] = []
        alive: set[int] = set()
        depths = self.depths
        first = self.chain_length
        added = 0
        for i, p in enumerate(self.parents):
            if depths[i] > depth or (p >= 0 and p not in alive):
                continue
            if i < first:
                if i >= chain:
                    continue
            elif added >= extra:
                continue
            else:
                added += 1
            kept.append(i)
            alive.add(i)
        return self._keep(kept)


@dataclass(frozen=True)
class Layout:
    """A verify block's rows for the forward: where each row is rotated (pos), written (slot),
    and what it attends (buffer rows 0..base-1, then tail)."""

    pos: list[int]
    slot: list[int]
    base: list[int]
    tail: list[list[int]]


def layout(fed: int, tree: DraftTree) -> Layout:
    """The rows of [root, *nodes] on top of `fed` cached positions (see the module note)."""
    pos, slot, base, tail = [fed], [fed], [fed + 1], [[]]
    depths = tree.depths
    for i in range(len(tree)):
        path = [fed + 1 + n for n in tree.path(i)]
        pos.append(fed + depths[i])
        slot.append(fed + 1 + i)
        if path == list(range(fed + 1, fed + 2 + i)):  # rows fed..fed+1+i, a prefix
            base.append(fed + 2 + i)
            tail.append([])
        else:
            base.append(fed + 1)
            tail.append(path)
    return Layout(pos, slot, base, tail)


def merge(branches: Sequence[Sequence[int]]) -> DraftTree:
    """A tree of token sequences that all start at the root, sharing common prefixes (a trie).
    The first branch is the tree's first chain; the other nodes follow shallowest first (the
    branches' order within a depth): an alternative's first tokens decide whether it is taken at
    all, so a node budget is better spent across branches than down one."""
    tokens: list[int] = []
    parents: list[int] = []
    depth: list[int] = []
    index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    for branch in branches:
        parent = -1
        for t in branch:
            node = index.get((parent, t))
            if node is None:
                node = len(tokens)
                tokens.append(t)
                parents.append(parent)
                depth.append(1 if parent < 0 else depth[parent] + 1)
                index[(parent, t)] = node
            parent = node
    first = len(branches[0]) if branches else 0  # the first branch's nodes are 0..first-1
    order = list(range(first)) + sorted(range(first, len(tokens)), key=lambda i: (depth[i], i))
    new = {old: i for i, old in enumerate(order)}
    return DraftTree(tuple(tokens[i] for i in order), tuple(-1 if parents[i] < 0 else new[parents[i]] for i in order))
