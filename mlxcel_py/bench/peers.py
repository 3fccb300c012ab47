"""The side-by-side peers for `mlxcel bench --vs`: stock mlx-lm and llama.cpp, each a worker process.

One long-lived subprocess per peer (peer_mlx_lm.py for mlx-lm, peer_llama_cpp.py for llama.cpp)
loads the model once and answers one request per prompt, so its runs interleave with ours in the
same benchmark. Only token ids cross the pipe, so every side sees the same prompt. mlx-lm's tok/s
is its own `generation_tps`; llama.cpp's is timed in its worker the same way (after the first token).
Each peer's configurations are labelled "<name> plain" and "<name> <drafter> k=N".
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import MlxcelError
from ..options import SamplingOptions


@dataclass(frozen=True)
class PeerOutput:
    tokens: int
    tps: float
    peak_mib: float
    prefill_s: float = 0.0  # llama.cpp: its call's start to the first token; 0 where not measured


class WorkerPeer:
    name = "peer"
    drafter = "draft"  # label of the peer's speculative configurations
    module = ""

    def __init__(
        self, args: Sequence[str], *, draft_widths: Sequence[int] = (), sampling: SamplingOptions = SamplingOptions()
    ):
        self.draft_widths = tuple(draft_widths)
        self.sampling = sampling
        self._log = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, "-m", self.module, *args]
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1
        )
        self._expect("ready")

    def configs(self) -> list[tuple[str, int | None]]:
        return [(f"{self.name} plain", None)] + [(f"{self.name} {self.drafter} k={w}", w) for w in self.draft_widths]

    def _expect(self, what: str) -> dict:
        line = self._proc.stdout.readline() if self._proc.stdout else ""
        if not line:
            self._log.seek(0)
            tail = [ln for ln in self._log.read().splitlines() if ln.strip()]
            raise MlxcelError(
                f"--vs {self.name}: the {self.name} worker stopped ({what}): {tail[-1] if tail else 'no output'}"
            )
        return json.loads(line)

    def generate(self, ids: Sequence[int], max_tokens: int, width: int | None = None) -> PeerOutput:
        s = self.sampling
        req = dict(
            ids=list(ids),
            max_tokens=max_tokens,
            num_draft=width,
            temp=s.temp,
            top_p=s.top_p,
            min_p=s.min_p,
            top_k=s.top_k,
        )
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(req) + "\n")
        self._proc.stdin.flush()
        out = self._expect("generate")
        return PeerOutput(out["tokens"], out["tps"], out["peak_mib"], out.get("prefill_s", 0.0))

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


class MlxLmPeer(WorkerPeer):
    """Stock mlx-lm: plain decoding and its `--draft-model` path at the full-model drafter's widths."""

    name, drafter, module = "mlx-lm", "draft", "mlxcel_py.bench.peer_mlx_lm"

    def __init__(
        self,
        model_path: Path,
        *,
        draft_path: Path | None = None,
        draft_widths: Sequence[int] = (),
        sampling: SamplingOptions = SamplingOptions(),
    ):
        args = [str(model_path)] + ([str(draft_path)] if draft_path else [])
        super().__init__(args, draft_widths=draft_widths if draft_path else (), sampling=sampling)


class LlamaCppPeer(WorkerPeer):
    """llama.cpp on the same GGUF file: plain decoding and its prompt lookup at the same widths."""

    name, drafter, module = "llama.cpp", "lookup", "mlxcel_py.bench.peer_llama_cpp"

    def __init__(
        self,
        gguf_path: Path,
        *,
        lookup_widths: Sequence[int] = (),
        ngram_max: int = 3,
        sampling: SamplingOptions = SamplingOptions(),
    ):
        super().__init__([str(gguf_path), str(ngram_max)], draft_widths=lookup_widths, sampling=sampling)
