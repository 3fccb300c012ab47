"""Several sequences' next forwards as one (`serve -np N`), each row exactly its own.

Two layouts. On the row-exact CPU path (the kernel weights, plain KV caches) the forward is
ragged: every row of every block (a plain step's one token, a verify block's tokens, a prompt
chunk) is its own batch entry of length 1 at its own position, so nothing is padded and a verify
block or a prompt chunk beside plain steps costs only its own rows. Each layer gets a `RowCaches`
for the sequences' caches of that layer: rope reads the per-entry positions as an array, and the
layer's cache writes and attentions are one op (`cpu_row_ops.cache_attention`) that writes every
row's key and value into its own sequence's buffer and attends each row over its own sequence up
to its position, with the one-row attention a solo step uses. Everything else (norms,
projections, the MLP, the output layer) is one batched op over all rows; rows of prompt chunks
skip the output layer where the model's forward is the usual trunk + head. Elsewhere the block
is (B, L), padded to the widest, and each row goes through its own cache and attention call.
No mask either way: a row never sees another sequence. (mlx-lm's BatchGenerator / BatchKVCache
left-pad the sequences into one cache and mask the padding; a row's attention then reduces over
another key count than its solo step does, so rows would not be exact, and mlx-lm does not batch
seeded requests. Here each sequence keeps its own KVCache and its own draws.)

Exactness: on the row-exact CPU path every matmul row is bit-identical whatever the block, and
attention, SwiGLU and rope compute each row alone, so a sequence's logits in a batch equal its
solo step bit for bit. `probe` checks that on the loaded model before a server batches (sequences
of different lengths, a verify block beside plain steps, batched against solo) and says which it
is: exact, differing by a measured amount (float32 BLAS rows can change in the last bits with the
block height), or not batchable (the architecture's rope or attention does not take per-row
offsets); the last falls back to one forward per sequence.

Speculation under load: `gate.Gate` decides each tick whether the batch's rows may verify drafts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from ..cpu import extension as cpu_extension
from ..cpu import kernels as cpu_kernels
from ..cpu import layers as cpu_layers
from ..cpu import row_ops as cpu_row_ops
from ..models import cache_kinds
from ..models.taps import trunk_and_head
from .cache import SequenceCache
from .tree import DraftTree, Layout, layout


class RowCaches:
    """One layer's caches of several sequences, as one cache for a batched forward.

    The forward's batch entries map to the sequences: in the padded layout entry b is sequence b
    (its block padded to the widest); in the ragged one every entry is one row, and the rows of a
    verify block are consecutive entries of one sequence at consecutive positions (`plan`: each
    entry's sequence and position, worked out once per forward; None in the padded layout).

    Ragged (the row-exact path): the layer's cache writes and all its attentions are one op
    (`cpu_row_ops.cache_attention`): `update_and_fetch` only holds the new keys and values, and
    `attend_rows` (called by the attention dispatcher) writes them into each sequence's buffers
    and attends every row over its own sequence up to its position, with the same one-row code a
    solo step runs. A 2,000-op graph of per-row slices, cache writes and attentions at 8 sequences
    becomes 30 ops. Padded (elsewhere): each row goes through its own cache and its own attention
    call."""

    def __init__(self, caches: Sequence[Any], offset: mx.array, plan: RaggedPlan | None = None):
        self.caches = list(caches)
        self.offset = offset  # per-entry positions, for rope
        self.plan = plan  # None: the padded layout
        self._held: tuple[mx.array, mx.array] | None = None

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        if self.plan is None:
            return self._write_rows(keys, values)
        if not (keys.dtype == values.dtype == mx.float32 and keys.shape == values.shape):
            raise RuntimeError("a ragged batch needs float32 keys and values of one shape")
        self._held = (keys, values)  # written by attend_rows, in the same op as the attention
        return keys, values

    def _write_rows(self, keys: mx.array, values: mx.array):
        got = [c.update_and_fetch(keys[b : b + 1], values[b : b + 1]) for b, c in enumerate(self.caches)]
        return [k for k, _ in got], [v for _, v in got]

    def attend_rows(self, queries, keys, values, scale, mask, sinks, covered: bool) -> mx.array:
        if self.plan is not None:
            held, self._held = self._held, None
            if held is None or not covered or not cpu_kernels.row_exact_now():
                raise RuntimeError("a ragged batch needs the row-exact attention")
            return self._fused(queries, *held, scale)
        return mx.concatenate(
            [
                cpu_kernels.scaled_dot_product_attention(queries[b : b + 1], k, v, c, scale, mask, sinks)
                for b, (k, v, c) in enumerate(zip(keys, values, self.caches))
            ],
            axis=0,
        )

    def _fused(self, queries: mx.array, keys: mx.array, values: mx.array, scale: float) -> mx.array:
        if keys.shape[2] != 1:
            raise RuntimeError("a ragged batch has one row per entry")
        plan = self.plan
        for c, e in zip(self.caches, plan.ends):
            cache_kinds.reserve(c, e - c.offset, keys.shape[1], keys.shape[3])
        got = cpu_row_ops.cache_attention(
            queries,
            keys,
            values,
            [c.keys for c in self.caches],
            [c.values for c in self.caches],
            plan.seq,
            plan.pos,
            float(scale),
            plan.tree,
        )
        count = len(self.caches)
        for s, (c, e) in enumerate(zip(self.caches, plan.ends)):
            c.keys, c.values = got[1 + s], got[1 + count + s]
            c.offset = e
        return got[0]


@dataclass(frozen=True)
class RaggedPlan:
    """A ragged forward's entries as the fused op takes them: each entry's sequence and position,
    and each sequence's end once its rows are written. The same for every layer (they all hold
    the same positions), so a forward works it out once instead of once per layer. `tree`: where
    a draft tree rides in the forward, every entry's slot, prefix and tail (engine.tree.Layout;
    a plain row writes at its position and sees the prefix up to it)."""

    seq: list[int]
    pos: list[int]
    ends: list[int]
    tree: Layout | None = None

    @staticmethod
    def of(
        entries: Sequence[tuple[int, int]], offsets: Sequence[int], trees: Sequence[Layout | None] = ()
    ) -> RaggedPlan:
        """`trees[b]`: sequence b's rows are a draft tree's (its layout), else consecutive rows."""
        ends = list(offsets)
        for seq, pos in entries:
            ends[seq] = max(ends[seq], pos + 1)
        seq, pos = [e[0] for e in entries], [e[1] for e in entries]
        if not any(t is not None for t in trees):
            return RaggedPlan(seq, pos, ends)
        # a tree's row i is written where a block's row i would be (its slot is the entry's
        # position); it is rotated at its depth's position and sees its prefix and tail
        rows: list[tuple[int, int, list[int]]] = []  # (pos, base, tail)
        for b, p in entries:
            t = trees[b]
            if t is None:
                rows.append((p, p + 1, []))
            else:
                i = p - offsets[b]
                assert t.slot[i] == p, "a tree's layout is laid on its sequence's offset"
                rows.append((t.pos[i], t.base[i], t.tail[i]))
        pos = [r[0] for r in rows]
        return RaggedPlan(
            seq, pos, ends, Layout(pos, [e[1] for e in entries], [r[1] for r in rows], [r[2] for r in rows])
        )


def _fusable(model: Any, seqs: Sequence[SequenceCache]) -> bool:
    """Whether a forward of these sequences can use the fused cache attention (and so the ragged
    layout): the row-exact kernel path and plain KV caches."""
    return (
        cpu_kernels.row_exact(model)
        and cpu_extension.kernel_status()[0] is not None
        and all(type(c) is KVCache for s in seqs for c in s.layers)
    )


def ragged(model: Any) -> bool:
    """Whether batched forwards of this model go in unpadded (see batched_forward)."""
    return _fusable(model, [SequenceCache(model)])


def why_no_trees(model: Any) -> str | None:
    """Why this model's forward cannot verify a draft tree (None: it can). A tree's rows go in as
    the ragged layout's entries (engine/tree.py), which needs the row-exact kernel and plain KV
    caches: a recurrent state or a rotating window cannot hold several branches at once."""
    if not (cpu_kernels.row_exact(model) and cpu_extension.kernel_status()[0] is not None):
        return "the row-exact CPU kernel does not carry this model (the float32 path has no per-row tree attention)"
    layers = SequenceCache(model).layers
    if not all(type(c) is KVCache for c in layers):
        return f"its caches are not all plain KV caches ({cache_kinds.describe_kinds(layers)})"
    return None


def batched_forward(
    model: Any,
    seqs: Sequence[SequenceCache],
    blocks: Sequence[Sequence[int]],
    wants: Sequence[bool] | None = None,
    trees: Sequence[DraftTree | None] | None = None,
) -> list[mx.array | None]:
    """Feed blocks[b] to seqs[b]; returns each block's logits rows (len_b, V), or None for a block
    whose logits are not wanted (wants[b] False: a prompt chunk), where the model lets the output
    layer skip its rows. `trees[b]`: block b is [last, *tree.tokens], a draft tree's rows
    (engine/tree.py; the ragged layout only).

    On the kernel path the blocks go in unpadded (ragged: one entry per row), in forwards of at
    most KERNEL_ROWS rows so every matmul stays on the row-exact kernel. Elsewhere they are padded
    to the widest, in groups that fit the row-exact limit where there is one (at most 64 padded
    rows on that path: a wider block would go through float32 BLAS, whose rows are not exact)."""
    ragged = _fusable(model, seqs)
    limit = cpu_layers.KERNEL_ROWS if ragged else cpu_kernels.prefill_chunk(model, 1 << 30)
    wants = list(wants) if wants is not None else [True] * len(seqs)
    trees = list(trees) if trees is not None else [None] * len(seqs)
    if not ragged and any(t is not None for t in trees):
        raise RuntimeError("a draft tree needs the ragged row-exact forward (why_no_trees)")

    def forward(a: int, b: int) -> list[mx.array | None]:
        if ragged:
            return _forward_ragged(model, seqs[a:b], blocks[a:b], wants[a:b], trees[a:b])
        return list(_forward(model, seqs[a:b], blocks[a:b]))

    out: list[mx.array | None] = []
    start, width, rows = 0, 0, 0
    for end in range(len(seqs)):
        wider, more = max(width, len(blocks[end])), rows + len(blocks[end])
        cost = more if ragged else (end - start + 1) * wider
        if end > start and cost > limit:  # the group so far goes first
            out += forward(start, end)
            start, wider, more = end, len(blocks[end]), len(blocks[end])
        width, rows = wider, more
    return out + forward(start, len(seqs))


def _forward_ragged(
    model: Any,
    seqs: Sequence[SequenceCache],
    blocks: Sequence[Sequence[int]],
    wants: Sequence[bool],
    trees: Sequence[DraftTree | None] = (),
) -> list[mx.array | None]:
    """One forward of all blocks' rows, one batch entry per row (nothing padded): row i of
    sequence b is an entry of length 1 at position offset_b + i, so rope and the fused attention
    see every row at its own position, and a verify block's row sees the rows before it. A draft
    tree's rows stand at their depths and see their ancestors (engine.tree.layout). Rows of
    unwanted blocks skip the output layer where the model's forward is the usual trunk + head."""
    entries = [(b, s.layers[0].offset + i) for b, (s, blk) in enumerate(zip(seqs, blocks)) for i in range(len(blk))]
    offsets = [s.layers[0].offset for s in seqs]
    layouts = [layout(offsets[b], t) if t is not None else None for b, t in enumerate(trees)]
    plan = RaggedPlan.of(entries, offsets, layouts)
    offset = mx.array(plan.pos, dtype=mx.int32)
    layers = [RowCaches([s.layers[i] for s in seqs], offset, plan) for i in range(len(seqs[0].layers))]
    x = mx.array([[t] for blk in blocks for t in blk], dtype=mx.int32)
    split = trunk_and_head(model) if not all(wants) else None
    with cpu_kernels.engaged(model):
        if split is None:
            logits = model(x, cache=layers)
        else:
            trunk, head = split
            hidden = trunk(x, cache=layers)
            starts = [0]
            for blk in blocks:
                starts.append(starts[-1] + len(blk))
            keep = [r for b, w in enumerate(wants) if w for r in range(starts[b], starts[b + 1])]
            picked = head(hidden[mx.array(keep, dtype=mx.int32)]) if keep else None
    out: list[mx.array | None] = []
    start = kept = 0
    for s, b, w in zip(seqs, blocks, wants):
        # a drafter's tap recorded every entry's rows: (entries, 1, F), this block's are consecutive
        s.appended(list(b), one_block=True, tapped=lambda tap, a=start, n=len(b): tap.last[a : a + n, 0])
        if split is None:
            out.append(logits[start : start + len(b), 0])
        elif w:
            out.append(picked[kept : kept + len(b), 0])
            kept += len(b)
        else:
            out.append(None)
        start += len(b)
    return out


def _forward(model: Any, seqs: Sequence[SequenceCache], blocks: Sequence[Sequence[int]]) -> list[mx.array]:
    """One forward of all `blocks`, padded. Blocks of unequal length (a verify round beside plain
    steps) are padded at their end with their last token; padded rows come after the real ones, so
    causal attention keeps them out of every real row, and they are trimmed from the caches
    afterwards (trim-only caches: `probe`)."""
    width = max(len(b) for b in blocks)
    offset = mx.array([s.layers[0].offset for s in seqs], dtype=mx.int32)
    layers = [RowCaches([s.layers[i] for s in seqs], offset) for i in range(len(seqs[0].layers))]
    x = mx.array([list(b) + [b[-1]] * (width - len(b)) for b in blocks], dtype=mx.int32)
    with cpu_kernels.engaged(model):
        logits = model(x, cache=layers)
    out = []
    for i, (s, b) in enumerate(zip(seqs, blocks)):
        if len(b) < width:
            for c in s.layers:
                c.trim(width - len(b))
        s.appended(list(b), one_block=True, tapped=lambda tap, i=i, n=len(b): tap.last[i, :n])
        out.append(logits[i, : len(b)])
    return out


def batched_step(model: Any, seqs: Sequence[SequenceCache], tokens: Sequence[int]) -> mx.array:
    """One token for each sequence in one forward; logits (B, V), row b for seqs[b]."""
    return mx.concatenate(batched_forward(model, seqs, [[t] for t in tokens]), axis=0)


def solo_forward(
    seqs: Sequence[SequenceCache], blocks: Sequence[Sequence[int]], trees: Sequence[DraftTree | None] = ()
) -> list[mx.array]:
    """The fallback: one forward per sequence, in turn (a draft tree's as a ragged forward of its own)."""
    trees = list(trees) or [None] * len(seqs)
    return [
        s.feed(list(b)) if t is None else batched_forward(s.model, [s], [b], trees=[t])[0]
        for s, b, t in zip(seqs, blocks, trees)
    ]


@dataclass(frozen=True)
class Probe:
    mode: str  # "exact" | "inexact" | "solo"
    detail: str

    @property
    def batches(self) -> bool:
        return self.mode != "solo"


def probe(model: Any, vocab: int) -> Probe:
    """Batched rows against solo steps on this model, before any request depends on it."""
    if not cpu_kernels.install_dispatch(model):
        return Probe("solo", "the architecture does not call mlx-lm's attention by name")
    if not SequenceCache(model).trim_only:
        return Probe("solo", "its caches are not all plain KV caches (padded rows are trimmed away)")
    ids = [[(7 * i + 3) % vocab for i in range(n)] for n in (5, 9, 2)]

    def fresh():
        out = []
        for seq in ids:
            c = SequenceCache(model)
            c.prefill(seq[:-1])
            out.append(c)
        return out

    # a plain step for each, then a verify-like block of 3 beside two plain steps (padding)
    rounds = [[seq[-1:] for seq in ids], [[1, 2, 3], [1], [4]]]
    solo = fresh()
    want = [[s.feed(b) for s, b in zip(solo, blocks)] for blocks in rounds]
    batch = fresh()
    try:
        got = [batched_forward(model, batch, blocks) for blocks in rounds]
        mx.eval(got)
    except Exception as exc:  # rope or attention without per-row offsets
        return Probe("solo", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": "))
    diff = 0.0
    for w_round, g_round in zip(want, got):
        for w, g in zip(w_round, g_round):
            diff = max(diff, mx.max(mx.abs(w.astype(mx.float32) - g.astype(mx.float32))).item())
    if diff == 0.0:
        return Probe("exact", "batched rows equal solo decode steps bit for bit")
    return Probe(
        "inexact",
        f"batched rows differ from solo steps by up to {diff:.2g} (float rounding); "
        f"greedy output can differ where two logits are that close",
    )
