"""One sequence's model caches: feeding tokens, exact rollback of every cache kind, prefix reuse.

Speculation feeds a block of tokens and then keeps only a prefix of it, so every cache must be
able to forget its newest positions. mlx-lm's `trim` does that for plain KV caches only; how each
other kind is checkpointed, restored or sliced is in `models/cache_kinds` (one adapter per kind).
This class drives them, in the one place that the verify round, the drafters and the warmup use.
A rollback takes, in order of cost: a rewind in place (trims, a window's slice); Gated DeltaNet
layers (Qwen3.5, Qwen3-Next) on the CPU pick the state recorded after the kept step
(`cpu.recurrent_steps`); anything else restores the checkpoint and replays the kept tokens, a
replay deferred to ride in front of the next forward (`_pending`), so a partial accept costs a few
extra rows in the next block instead of an extra forward.

When a rollback cannot be done by trims and slices alone, every layer goes back to the checkpoint
together (trim layers are trimmed to it) and the kept tokens are replayed: the layers of one model
always stand at the same position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from ..cpu import kernels as cpu_kernels
from ..cpu import recurrent_steps
from ..cpu import row_ops as cpu_row_ops
from ..models import cache_kinds, kv_cache
from ..models.cache_kinds import adapter_for


@dataclass
class Checkpoint:
    position: int  # positions held by the layers when it was taken
    snaps: list


def text_ids(ids: Sequence[int]) -> list[int]:
    """`ids` with a vision prompt's image ids (negative, vision.target) as token 0."""
    return [t if t >= 0 else 0 for t in ids] if ids and min(ids) < 0 else list(ids)


def text_prefix(tokens: Sequence[int]) -> int:
    """How many of `tokens` come before the first image id (a drafter copying a prompt may
    propose them; the target never picks one, and a sampled verify must never take one)."""
    if min(tokens) >= 0:
        return len(tokens)
    return next(i for i, t in enumerate(tokens) if t < 0)


def _arrays(x: Any) -> list:
    """The arrays in a tree of caches' states (which also hold offsets, None and other leaves)."""
    return [v for _, v in tree_flatten(x) if isinstance(v, mx.array)]


# Prompt tokens per forward in prefill: bounds memory, and is how often a cancelled request (a
# server client that left, Ctrl-C) is noticed; on this CPU 512 tokens take about a second.
PREFILL_CHUNK = 512


def _new_layers(model: Any) -> list:
    """mlx-lm's caches for `model`, holding the cache type its mlx-lm-written layers keep
    (models.kv_cache.store_caches: f16/bf16 where the fused layers do not run)."""
    layers = make_prompt_cache(model)
    kv_cache.store_caches(model, layers)
    return layers


class SequenceCache:
    """A model's layer caches plus the token ids they stand for, in order.

    `tokens` are the committed positions; the newest `len(_pending)` of them are not in the layers
    yet (restored away by a rollback) and are fed in front of the next forward.

    With `keep_hidden(tap)` (drafters that read the target: MTP heads take the final norm's output,
    models.taps.hidden_tap; DFlash takes chosen layers' outputs, models.taps.layer_tap) the tap's rows
    of committed positions [hidden_start, len(tokens)) are kept, whoever ran the forward (this
    cache's `run`, or a batched forward through `appended`). A rollback keeps the rows of kept
    tokens even when their replay is pending: the block computed them already.
    """

    use_steps = True  # per-step Gated DeltaNet states where available (scripts/rollback_cost.py compares)

    def __init__(self, model: Any, channel: Any = None):
        self.model = model
        # mirror.Leader: each forward is announced to the other ranks, which mirror it
        self.channel = channel
        self.seq_id = channel.new_sequence() if channel is not None else 0
        self.layers = _new_layers(model)
        self.tokens: list[int] = []
        self._pending: list[int] = []
        self._checkpoint: Checkpoint | None = None
        self._last_write = 0
        self._tap = None  # a models.taps tap while hidden states are kept
        # Gated DeltaNet layers whose per-step states a marked block records: {index: conv kernel}
        self._steps = recurrent_steps.enable(model) if self.use_steps else {}
        self._recording = False
        self._step_records: dict | None = None
        # the tap's rows, (rows, H): a forward's rows are appended as a part and the parts joined
        # once, when read (a join per forward copied every kept row again: quadratic over the
        # plain steps between two drafts, ~2 ms a round for a paused EAGLE-3 drafter)
        self._hidden_parts: list[mx.array] = []
        self.hidden_start = 0
        self.hidden_window: int | None = None  # keep_hidden's window
        self.trim_only = cache_kinds.trim_only(self.layers)
        # a vision model reads its prompts' image ids (vision.target); a text model (a drafter
        # beside it) sees token 0 there, while `tokens` keep the ids so prefixes still match
        self.image_ids = getattr(model, "takes_image_ids", False)

    # -- feeding -------------------------------------------------------------------------------
    @property
    def fed(self) -> int:
        """Positions actually held by the layers."""
        return len(self.tokens) - len(self._pending)

    def run(self, x: mx.array) -> mx.array:
        """The model on `x` (1-D int32 ids, possibly lazy) after any pending replay; returns the
        logits rows of `x` only. Token bookkeeping is the caller's (`appended`)."""
        if self._pending:
            x = mx.concatenate([mx.array(self._pending, dtype=mx.int32), x.astype(mx.int32)])
        if self.channel is not None:
            with self.channel.forward(self.seq_id, self.fed, x) as ids, cpu_kernels.engaged(self.model):
                logits = self.model(ids[None], cache=self.layers)[0]
            self._last_write = x.shape[0]
            return logits  # trim-only caches: nothing is ever pending, no per-step records
        with cpu_kernels.engaged(self.model):
            if self._recording:
                with recurrent_steps.recording() as records:
                    logits = self.model(x[None], cache=self.layers)[0]
                self._step_records = recurrent_steps.by_layer(records, list(self._steps))
            else:
                logits = self.model(x[None], cache=self.layers)[0]
                self._step_records = None
            if self._tap is not None:
                self._keep_rows(self._tap.last[0, len(self._pending) :])  # replayed rows are kept already
        self._last_write = x.shape[0]
        if self._pending:
            logits = logits[len(self._pending) :]
            self._pending = []
        return logits

    def feed(self, inputs: Sequence[int]) -> mx.array:
        """Run `inputs` through the model on top of this cache; returns logits (len(inputs), V)."""
        ids = list(inputs) if self.image_ids else text_ids(inputs)
        logits = self.run(mx.array(ids, dtype=mx.int32))
        self.tokens.extend(inputs)
        return logits

    def appended(self, tokens: Sequence[int], *, one_block: bool = False, tapped: Any = None) -> None:
        """Record that `tokens` were just fed: through `run`, or (one_block) as one block of a
        batched forward that called the model itself; how wide the last write was decides whether
        a window can drop rows in place. `tapped(tap)`: this block's rows of a tap's latest output
        (the batched forward's), kept while `keep_hidden` is on."""
        if self._tap is not None and one_block:
            rows = tapped(self._tap) if tapped is not None else None
            if rows is None:
                raise RuntimeError("a batched forward fed a sequence that keeps hidden states without them")
            self._keep_rows(rows)
        self.tokens.extend(tokens)
        if one_block:
            self._last_write = len(tokens)

    def prefill(self, tokens: Sequence[int], chunk: int | None = None, stop: Callable[[], bool] | None = None) -> bool:
        """Feed `tokens` in chunks, evaluating the cache after each so memory stays bounded.
        `stop` is asked between chunks (a server's cancelled request); False if it ended early.
        The row-exact kernel path feeds short chunks (`cpu_kernels.prefill_chunk`)."""
        for done in self.prefill_steps(tokens, chunk, stop):
            if not done:
                return False
        return True

    def prefill_steps(
        self, tokens: Sequence[int], chunk: int | None = None, stop: Callable[[], bool] | None = None
    ) -> Iterator[bool]:
        """`prefill` one chunk per step (a server interleaves other sequences' decode steps):
        yields True after each chunk, False (and ends) when `stop` says so."""
        chunk = chunk or cpu_kernels.prefill_chunk(self.model, PREFILL_CHUNK)
        for i in range(0, len(tokens), chunk):
            if stop is not None and stop():
                yield False
                return
            self.feed(tokens[i : i + chunk])
            self.eval()
            yield True

    def settle(self) -> None:
        """Replay pending tokens now, so the layers hold every committed position."""
        if self._pending:
            self.run(mx.array([], dtype=mx.int32))
            self.eval()

    @property
    def hidden(self) -> mx.array | None:
        if len(self._hidden_parts) > 1:
            self._hidden_parts = [mx.concatenate(self._hidden_parts)]
        return self._hidden_parts[0] if self._hidden_parts else None

    @hidden.setter
    def hidden(self, rows: mx.array | None) -> None:
        self._hidden_parts = [] if rows is None else [rows]

    def _keep_rows(self, rows: mx.array) -> None:
        if self.hidden_window is not None:  # older rows are never read: let them go now and then
            kept = sum(p.shape[0] for p in self._hidden_parts)  # committed rows (before this forward's)
            if kept > 2 * self.hidden_window:  # keeps the newest `window` of them, whatever a rollback cuts
                self.drop_hidden_before(self.hidden_start + kept - self.hidden_window)
        self._hidden_parts.append(rows)

    def keep_hidden(self, tap, window: int | None = None) -> None:
        """Keep a tap's output rows from now on (a models.taps tap), or stop (None); `window`: the
        drafter never reads more than that many of the newest rows (older ones may go).
        Invariant while on: rows cover committed positions [hidden_start, len(tokens))."""
        if tap is not self._tap:
            self.hidden, self.hidden_start = None, len(self.tokens)
        self._tap, self.hidden_window = tap, window

    def hidden_rows(self, start: int, end: int) -> mx.array:
        """The tap's rows of positions start..end-1 (all committed)."""
        assert self.hidden_start <= start <= end <= self.hidden_start + self.hidden.shape[0]
        return self.hidden[start - self.hidden_start : end - self.hidden_start]

    def drop_hidden_before(self, position: int) -> None:
        if self.hidden is not None and position > self.hidden_start:
            self.hidden = self.hidden[position - self.hidden_start :]
            self.hidden_start = position

    def _cut_hidden(self, n: int) -> None:
        if not self._hidden_parts:
            self.hidden_start = min(self.hidden_start, n)
        elif n <= self.hidden_start:
            self.hidden, self.hidden_start = None, n
        else:  # whole parts from the end, without joining the rest (a rollback each verify round)
            keep, parts = n - self.hidden_start, []
            for part in self._hidden_parts:
                if keep <= 0:
                    break
                parts.append(part if part.shape[0] <= keep else part[:keep])
                keep -= part.shape[0]
            self._hidden_parts = parts

    def eval(self) -> None:
        mx.eval(_arrays([c.state for c in self.layers]))

    # -- rollback ------------------------------------------------------------------------------
    def mark(self) -> None:
        """Checkpoint the layers before a block that may be partly rolled back (free for trim-only
        models, references for the others)."""
        if self.trim_only:
            return
        self._checkpoint = Checkpoint(self.fed, [adapter_for(c).snapshot(c) for c in self.layers])
        self._recording = bool(self._steps)

    def release(self) -> None:
        """Drop the checkpoint (its references would make later in-place writes copy buffers)
        and any per-step states."""
        self._checkpoint = None
        self._recording, self._step_records = False, None

    def _picks_state(self, i: int, k: int) -> bool:
        """Layer i's state after dropping the newest k positions was recorded in the last write."""
        return self._step_records is not None and i in self._step_records and k < self._last_write

    def truncate(self, n: int) -> bool:
        """Keep only the first n tokens. False (and nothing changed) if that needs a checkpoint at
        or before n and there is none."""
        drop = len(self.tokens) - n
        if drop <= 0:
            return True
        fed = self.fed
        if n >= fed:  # only replay-pending tokens go
            del self._pending[len(self._pending) - drop :]
            del self.tokens[n:]
            self._cut_hidden(n)
            return True
        k = fed - n  # positions to remove from the layers
        if all(
            self._picks_state(i, k) or adapter_for(c).can_rewind(c, k, self._last_write)
            for i, c in enumerate(self.layers)
        ):
            for i, c in enumerate(self.layers):
                if self._picks_state(i, k):
                    recurrent_steps.pick(c, self._step_records[i], self._last_write - k, self._steps[i])
                else:
                    adapter_for(c).rewind(c, k)
            self._last_write -= k
            self._step_records = None  # the recorded steps no longer line up with the cache
            self._pending = []
        elif self._checkpoint is not None and self._checkpoint.position <= n:
            cp = self._checkpoint
            for c, snap in zip(self.layers, cp.snaps):
                adapter_for(c).restore(c, snap, fed - cp.position)
            self._pending = self.tokens[cp.position : n]
            self._last_write = 0
        else:
            return False
        del self.tokens[n:]
        self._cut_hidden(n)
        return True

    def keep_rows(self, first: int, rows: Sequence[int]) -> None:
        """Keep, of the positions from `first` on, only `rows` (increasing, each at or after first),
        moved down to first, first + 1, ...: a draft tree's accepted path after its verify forward
        (engine/tree.py). The layers, the tokens and any kept tap rows end as a chain of the same
        tokens would have left them. Plain KV caches only (batch.why_no_trees)."""
        rows = list(rows)
        n = len(rows)
        if rows != list(range(first, first + n)):
            layers = self.layers
            moved = cpu_row_ops.move_rows([c.keys for c in layers] + [c.values for c in layers], rows, first)
            for i, c in enumerate(layers):
                c.keys, c.values = moved[i], moved[len(layers) + i]
            if self.hidden is not None:  # covers hidden_start.. (at or before the tree's root)
                at = first - self.hidden_start
                assert at >= 0, "kept tap rows start after a tree's first row"
                picked = self.hidden[mx.array([r - self.hidden_start for r in rows], dtype=mx.int32)]
                self.hidden = mx.concatenate([self.hidden[:at], picked, self.hidden[at + n :]])
            self.tokens[first : first + n] = [self.tokens[r] for r in rows]
        assert not self._pending, "a tree rides on caches a trim rolls back"
        self.truncate(first + n)  # the rows after the path: the rejected nodes

    def reset(self) -> None:
        self.layers = _new_layers(self.model)
        self.tokens, self._pending, self._checkpoint, self._last_write = [], [], None, 0
        self._recording, self._step_records = False, None
        self.hidden, self.hidden_start = None, 0

    def reuse_prefix(self, tokens: Sequence[int]) -> int:
        """Trim to the longest common prefix with `tokens` (at most len-1); return its length."""
        limit = min(len(self.tokens), len(tokens) - 1)
        n = 0
        while n < limit and self.tokens[n] == tokens[n]:
            n += 1
        if not self.truncate(n):
            self.reset()
            return 0
        return n
