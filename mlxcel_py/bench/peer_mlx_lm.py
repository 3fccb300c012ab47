"""Stock mlx-lm in its own process, for `mlxcel bench --vs mlx-lm`.

Run as `python -m mlxcel_py.bench.peer_mlx_lm MODEL [DRAFT_MODEL]`. It never imports mlxcel_py's fast
path, so mlx-lm runs exactly as a user gets it (bundled BLAS, weights as stored). Protocol: one
JSON object per line on stdin ({"ids", "max_tokens", "num_draft"?, sampling...}), one JSON answer
per line on the original stdout; anything mlx-lm prints goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # library output (C or Python) must not corrupt the protocol stream
    sys.stdout = sys.stderr

    import mlx.core as mx
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = mlx_lm.load(sys.argv[1])
    draft = mlx_lm.load(sys.argv[2])[0] if len(sys.argv) > 2 and sys.argv[2] else None
    proto.write(json.dumps({"ready": True}) + "\n")
    proto.flush()
    for line in sys.stdin:
        req = json.loads(line)
        sampler = make_sampler(
            req.get("temp", 0.0), top_p=req.get("top_p", 1.0), min_p=req.get("min_p", 0.0), top_k=req.get("top_k", 0)
        )
        extra = {}
        if req.get("num_draft"):
            extra = dict(draft_model=draft, num_draft_tokens=req["num_draft"])
        mx.reset_peak_memory()
        n, tps = 0, 0.0
        for r in mlx_lm.stream_generate(
            model, tokenizer, req["ids"], max_tokens=req["max_tokens"], sampler=sampler, **extra
        ):
            n, tps = r.generation_tokens, r.generation_tps
        proto.write(json.dumps({"tokens": n, "tps": tps, "peak_mib": mx.get_peak_memory() / 2**20}) + "\n")
        proto.flush()


if __name__ == "__main__":
    main()
