"""The side-by-side peer for `mlxcel bench --vs mlx-lm`: a stock mlx-lm worker process.

One long-lived subprocess (see peer_worker.py) loads the model once and answers one request per
prompt, so its runs interleave with ours in the same benchmark. Only token ids cross the pipe,
so both sides see the same prompt. mlx-lm's tok/s is its own `generation_tps`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .errors import MlxcelError
from .options import SamplingOptions


@dataclass(frozen=True)
class PeerOutput:
    tokens: int
    tps: float
    peak_mib: float


class MlxLmPeer:
    name = "mlx-lm"

    def __init__(self, model_path: Path, *, draft_path: Path | None = None, draft_widths: Sequence[int] = (),
                 sampling: SamplingOptions = SamplingOptions()):
        self.draft_widths = tuple(draft_widths) if draft_path else ()
        self.sampling = sampling
        self._log = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, "-m", "mlxcel_py.peer_worker", str(model_path)]
        if draft_path:
            cmd.append(str(draft_path))
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                      text=True, bufsize=1)
        self._expect("ready")

    def configs(self) -> list[tuple[str, int | None]]:
        return [("mlx-lm plain", None)] + [(f"mlx-lm draft k={w}", w) for w in self.draft_widths]

    def _expect(self, what: str) -> dict:
        line = self._proc.stdout.readline() if self._proc.stdout else ""
        if not line:
            self._log.seek(0)
            tail = [ln for ln in self._log.read().splitlines() if ln.strip()]
            raise MlxcelError(f"--vs mlx-lm: the stock mlx-lm worker stopped ({what}): "
                              f"{tail[-1] if tail else 'no output'}")
        return json.loads(line)

    def generate(self, ids: Sequence[int], max_tokens: int, width: int | None = None) -> PeerOutput:
        s = self.sampling
        req = dict(ids=list(ids), max_tokens=max_tokens, num_draft=width, temp=s.temp, top_p=s.top_p,
                   min_p=s.min_p, top_k=s.top_k)
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(req) + "\n")
        self._proc.stdin.flush()
        out = self._expect("generate")
        return PeerOutput(out["tokens"], out["tps"], out["peak_mib"])

    def warmup(self, ids: Sequence[int], max_tokens: int) -> None:
        for _, width in self.configs():
            self.generate(ids, max_tokens, width)

    def close(self) -> None:
        if self._proc.poll() is None:
            if self._proc.stdin:
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._log.close()
