"""`mlxcel bench --busy N`: N background busy loops at nice 19 while the benchmark runs.

Why: users decode with other programs open. On 2 cores one low-priority busy process used to cut
our 2-thread decode from ~61 to ~7-19 tok/s (a kernel call waited a scheduler slice for its
descheduled worker) while llama.cpp shrugged it off; a benchmark on a quiet machine hid that.
The loops are plain processes (`os.nice(19)`, then spin), started before the warmup and stopped
(SIGKILL, then reaped) when the run ends or fails, so none outlives the command.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

_LOOP = "import os\nos.nice(19)\nwhile True:\n    pass\n"


@contextmanager
def busy_loops(n: int) -> Iterator[list[int]]:
    """Run n nice-19 busy processes inside the block; yields their pids."""
    procs = [
        subprocess.Popen([sys.executable, "-c", _LOOP], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        for _ in range(n)
    ]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
