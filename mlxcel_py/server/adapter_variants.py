"""Adapter scales that change while serving: llama-server's POST /lora-adapters (the scales every
request gets from then on) and a request's own `lora` list ([{"id", "scale"}], adapters not listed
at 0).

Adapters are fused into the weights at load (models/adapters.py), so each set of scales is its own
fused model: the worker keeps the startup one and, beside it, the last few others a request asked
for (`KEEP` in all), each a whole engine with its drafters and its own prompt cache, so a prefix
cached under one set of scales is never reused under another (llama-server clears or keeps its
cache by the same rule). A new set costs one load on the worker thread (about a second for the
default model), which every live request waits for; requests under different scales then decode
side by side, each set's rows in their own batched forward. A set still in use is never dropped.

Routes read and set the global scales (`scales`, `set_global`); only the worker thread loads and
drops engines.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

KEEP = 3  # fused models kept at once: the startup one and the two most recently used
MAX_ENTRIES = 1024  # a `lora` list longer than this is refused before it is read


class AdapterVariants:
    def __init__(self, adapters: Sequence[Any], engine: Any, load: Callable[[tuple[float, ...]], Any]):
        self.adapters = list(adapters)  # models.adapters.Adapter, in id order
        self.startup = tuple(_scale(a.spec.scale) for a in self.adapters)
        self._scales = self.startup
        self._engines: OrderedDict[tuple[float, ...], Any] = OrderedDict({self.startup: engine})
        self._load = load
        self._lock = threading.Lock()
        self.loads = 0  # fused models loaded after startup (tests, the log)

    # ---- routes ---------------------------------------------------------------------------
    @property
    def scales(self) -> tuple[float, ...]:
        with self._lock:
            return self._scales

    def listing(self) -> list[dict]:
        """GET /lora-adapters: llama-server's entries, at the global scales."""
        scales = self.scales
        return [
            {
                "id": i,
                "path": a.spec.path,
                "scale": scales[i],
                "task_name": a.task_name,
                "prompt_prefix": a.prompt_prefix,
            }
            for i, a in enumerate(self.adapters)
        ]

    def requested(self, value: Any) -> tuple[float, ...]:
        """Scales from a [{"id", "scale"}, ...] list (a request's `lora`, POST /lora-adapters'
        body), an adapter it does not list at 0; ValueError with the 400's message."""
        if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
            raise ValueError("'lora' must be an array of objects with 'id' and 'scale' fields")
        if len(value) > MAX_ENTRIES:
            raise ValueError(f"'lora' has {len(value)} entries; the limit is {MAX_ENTRIES}")
        out = [0.0] * len(self.adapters)
        for entry in value:
            i, scale = entry.get("id"), entry.get("scale", 0.0)
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self.adapters):
                raise ValueError(f"invalid adapter id {i!r}: this server has {len(self.adapters)} adapter(s)")
            if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
                raise ValueError(f"adapter {i}: 'scale' must be a finite number")
            out[i] = _scale(scale)
        return tuple(out)

    def set_global(self, scales: tuple[float, ...]) -> None:
        with self._lock:
            self._scales = scales

    # ---- the worker thread ------------------------------------------------------------------
    def engine(self, scales: tuple[float, ...], busy: set[int]) -> Any:
        """The engine for `scales`, loaded if it is not kept; `busy`: the ids of the engines live
        requests decode on (never dropped)."""
        if scales in self._engines:
            self._engines.move_to_end(scales)
            return self._engines[scales]
        engine = self._load(scales)
        self.loads += 1
        self._engines[scales] = engine
        for key in list(self._engines):
            if len(self._engines) <= KEEP:
                break
            if key != self.startup and key != scales and id(self._engines[key]) not in busy:
                self._engines.pop(key).release()
        return engine

    def release(self) -> None:
        """Drop every fused model but the startup one (the server falls asleep)."""
        for key in [k for k in self._engines if k != self.startup]:
            self._engines.pop(key).release()

    def kept(self) -> list[tuple[float, ...]]:
        return list(self._engines)


def _scale(value: float) -> float:
    return float(value) + 0.0  # -0.0 and 0 name the same fused model
