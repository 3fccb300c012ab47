"""What the checks of model drafters' own checkpoints share: sizes against the target's config and
every tensor against the shapes the config implies (DFlash, EAGLE-3), and loading the weights
into the network with a one-line error when they do not fit (those two and the MTP head)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..errors import ModelError
from ..models.config import text_config


def check_sizes(where: str, fix: str, sizes: dict[str, int], target_cfg: dict) -> None:
    """Each of `sizes` (hidden_size, vocab_size...) equals the target's, where the target declares it."""
    tcfg = text_config(target_cfg)
    for key, mine in sizes.items():
        theirs = tcfg.get(key)
        if isinstance(theirs, int) and theirs != mine:
            raise ModelError(f"{where}: the drafter's {key} ({mine}) is not the target's ({theirs}); {fix}")


def check_shapes(
    where: str,
    what: str,
    found: dict[str, list[int]],
    want: dict[str, list[int]],
    stored_shape: Callable[[str, list[int]], list[int]] = lambda name, shape: shape,
) -> None:
    """Every tensor of `want` is in `found` with its shape (`stored_shape`: the shape a tensor is
    stored in, e.g. packed when quantized)."""
    for name, shape in want.items():
        if name not in found:
            raise ModelError(f"{where}: tensor {name} is missing; the checkpoint is incomplete or not {what}")
        shape = stored_shape(name, shape)
        if list(found[name]) != shape:
            raise ModelError(f"{where}: tensor {name} has shape {list(found[name])}, expected {shape} from config.json")


def fit(net: Any, weights: dict[str, mx.array], failure: str) -> Any:
    """Load `weights` into `net` (strict) and evaluate them; `failure` starts the error if they do not fit."""
    try:
        net.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise ModelError(f"{failure}: {str(exc).splitlines()[0]}") from None
    mx.eval(net.parameters())
    return net


CARD = "mlxcel_card.json"


def check_card(where: str, folder: Path, target: Any) -> None:
    """A drafter trained here is refused for any target but its own (its card's fingerprint);
    published checkpoints carry no card and are checked by their sizes alone."""
    from ..models.fingerprint import fingerprint

    path = folder / CARD
    if not path.is_file():
        return
    try:
        named = json.loads(path.read_text())["target"]
        mark, name = str(named["fingerprint"]), str(named.get("name") or named.get("path"))
    except (OSError, ValueError, KeyError, TypeError):
        raise ModelError(f"{where}: {CARD} is unreadable or damaged; train the drafter again") from None
    if fingerprint(target.path, target.gguf) != mark:
        raise ModelError(
            f"{where} was trained for another target ({name}); pass that model as -m, or train a drafter for "
            f"this one with `mlxcel draft train -m MODEL --out DIR`"
        )
