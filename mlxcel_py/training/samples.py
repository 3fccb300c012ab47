"""Recorded samples on disk (`OUT/.train/samples.safetensors`), so `--resume` trains on the same
data without decoding it again: token ids, the target's greedy labels, prompt lengths and the
tap's rows, concatenated (a file from before labels were kept trains on the answers' own ids)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import mlx.core as mx

from .recording import Sample


def save(path: Path, samples: Sequence[Sample]) -> None:
    if not samples:
        return
    lengths = [len(s.tokens) for s in samples]
    arrays = {
        "tokens": mx.array([t for s in samples for t in s.tokens], dtype=mx.int32),
        "labels": mx.array([t for s in samples for t in s.labels], dtype=mx.int32),
        "lengths": mx.array(lengths, dtype=mx.int32),
        "prompt_lens": mx.array([s.prompt_len for s in samples], dtype=mx.int32),
        "features": mx.concatenate([s.features for s in samples]),
    }
    tmp = path.with_name(path.name + ".tmp.safetensors")
    mx.save_safetensors(str(tmp), arrays)
    tmp.replace(path)


def load(path: Path) -> list[Sample]:
    if not path.is_file():
        return []
    a = mx.load(str(path))
    tokens, feats = a["tokens"].tolist(), a["features"]
    labels = a["labels"].tolist() if "labels" in a else tokens
    out, t, f = [], 0, 0
    for n, p in zip(a["lengths"].tolist(), a["prompt_lens"].tolist()):
        sample = Sample(tokens=tokens[t : t + n], prompt_len=p, features=feats[f : f + n - 1], labels=labels[t : t + n])
        out.append(sample)
        t, f = t + n, f + n - 1
    return out
