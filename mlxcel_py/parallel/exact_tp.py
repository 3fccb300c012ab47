"""Tensor parallelism with one process's bits: every linear split by its outputs.

Why. mlx-lm's `model.shard` splits the row-parallel linears (o_proj, down_proj) by their inputs
and joins the ranks' halves with an all-sum: each output is then two partial dot products added,
an order no single process has, so a sharded model's text drifts from one process's (and those
layers cannot go on the row-exact kernels). Here every linear is split by its outputs instead:
a rank computes whole dot products for its share of the output rows, which the row-exact kernels
make the same bits as one process's (each output reads its weights in input order, whichever
rows a call holds), and a join of the shares that is a copy, no arithmetic (`gather_last`).

How. mlx-lm's own `shard` still decides what splits and fixes the head counts. Then each
input-split layer it made (`ShardedToAll*`) is rebuilt from the unsplit layer as a `GatheredRows`:
the input's shards gathered, this rank's output rows, the outputs gathered. Each output-split
layer (`AllToSharded*`) becomes a plain `nn.Linear`/`nn.QuantizedLinear` holding its rows (its
forward is that already), so `cpu_weights.apply` puts both kinds on the kernels. A model whose
`shard` does anything else (experts, in-place splits) keeps mlx-lm's sharding (`why_not` says
why, from a dry run on a weightless instance).

Cost. Four joins a layer (the attention's heads, o_proj's rows, the MLP's middle, down_proj's
rows) against mlx-lm's two sums, each an all-sum of the full width per token row; every weight
is still read by one rank only.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

_ROWS = (nn.AllToShardedLinear, nn.QuantizedAllToShardedLinear)  # split by outputs: already exact
_INPUTS = (nn.ShardedToAllLinear, nn.QuantizedShardedToAllLinear)  # split by inputs: summed


def gather_last(x: mx.array, group: Any) -> mx.array:
    """The ranks' `x` joined along the last axis, in rank order.

    An all-sum of each rank's shard placed at its offset among negative zeros: x + (-0.0) is x
    for every float, +0.0, -0.0, inf and NaN included, in any order of addition, so the join is
    a copy. Not `all_gather`: when a peer dies, MLX's ring all-gather can wait forever on it
    (seen here with 16 gathers a forward), while a failed all-sum raises, which `guard` turns
    into the one-line lost-contact error."""
    n = group.size()
    if n == 1:
        return x
    width, rank = x.shape[-1], group.rank()
    placed = mx.pad(x, [(0, 0)] * (x.ndim - 1) + [(rank * width, (n - 1 - rank) * width)], constant_values=-0.0)
    return mx.distributed.all_sum(placed, group=group)


class GatheredRows(nn.Module):
    """A linear split by output rows between two gathers: every rank's input shard joined, this
    rank's rows of the product, every rank's rows joined."""

    # what the fused decoder layers ask (models.decoder_layers.why_not, which may not import
    # this module): a layer that talks to the other ranks mid-forward cannot run inside one op
    exchanges_rows = True

    def __init__(self, rows: nn.Module, group: Any):
        super().__init__()
        self.rows = rows  # nn.Linear / nn.QuantizedLinear (then a kernel layer) with this rank's rows
        self.group = group

    def __call__(self, x: mx.array) -> mx.array:
        return gather_last(self.rows(gather_last(x, self.group)), self.group)


def _plain(layer: nn.Module) -> nn.Module:
    """An output-split layer as the plain layer its forward is (no random initialisation)."""
    if isinstance(layer, nn.QuantizedAllToShardedLinear):
        out = nn.QuantizedLinear.__new__(nn.QuantizedLinear)
        nn.Module.__init__(out)
        out.group_size, out.bits, out.mode = layer.group_size, layer.bits, layer.mode
        out.weight, out.scales = layer["weight"], layer["scales"]
        out.biases = layer.get("biases")
    else:
        out = nn.Linear.__new__(nn.Linear)
        nn.Module.__init__(out)
        out.weight = layer["weight"]
    if "bias" in layer:
        out.bias = layer["bias"]
    out.freeze()
    return out


def _rows_of(layer: nn.Module, group: Any) -> nn.Module:
    """This rank's output rows of an unsplit linear, as a plain layer."""
    if isinstance(layer, nn.QuantizedLinear):
        return _plain(nn.QuantizedAllToShardedLinear.from_quantized_linear(layer, group=group))
    return _plain(nn.AllToShardedLinear.from_linear(layer, group=group))


class _Shape:
    """A group's size and rank without a group: enough for a dry run of a family's `shard`."""

    def __init__(self, n: int):
        self.n = n

    def size(self) -> int:
        return self.n

    def rank(self) -> int:
        return 0


def why_not(model: Any, size: int) -> str | None:
    """Why `model` (weights possibly lazy: untouched) cannot be split exactly over `size` ranks,
    or None: the split is tried on a weightless instance of its class, which reads nothing."""
    args = getattr(model, "args", None)
    if not hasattr(model, "shard") or args is None:
        return "it has no sharding in mlx-lm"
    try:
        return shard(type(model)(args), _Shape(size))
    except Exception as exc:  # a family's shard that needs a real group or more than its args
        return f"its sharding could not be tried ({type(exc).__name__}: {str(exc)[:80]})"


def shard(model: Any, group: Any) -> str | None:
    """Shard `model` for this rank with every linear split by outputs; None when done, else why
    not (the model then holds mlx-lm's own sharding: still a working split, not an exact one)."""
    from mlx.utils import tree_flatten, tree_unflatten

    before = dict(model.named_modules())
    shapes = {k: v.shape for k, v in tree_flatten(model.parameters())}
    model.shard(group)
    replaced: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if isinstance(module, _ROWS):
            replaced.append((name, _plain(module)))
        elif isinstance(module, _INPUTS):
            old = before.get(name)
            if type(old) not in (nn.Linear, nn.QuantizedLinear):
                return f"{name} was not a plain linear before sharding"
            replaced.append((name, GatheredRows(_rows_of(old, group), group)))
    if not any(isinstance(m, GatheredRows) for _, m in replaced):
        return "its sharding splits no layer by its inputs"
    # anything else the family's shard split (experts, in place) would still be summed somewhere
    inside = tuple(name + "." for name, _ in replaced)
    for key, value in tree_flatten(model.parameters()):
        if not key.startswith(inside) and shapes.get(key) != value.shape:
            return f"{key.rsplit('.', 1)[0]} was split another way"
    model.update_modules(tree_unflatten(replaced))
    return None
