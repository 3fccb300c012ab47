#!/usr/bin/env python
"""Write completions/mlxcel.{bash,zsh,fish} from the live command tree."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlxcel_py.completions import SCRIPTS  # noqa: E402

for name, make in SCRIPTS.items():
    (ROOT / "completions" / name).write_text(make())
    print(f"wrote completions/{name}")
