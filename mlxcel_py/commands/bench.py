"""Benchmark plain vs speculative decoding on a workload (table, JSON, width sweep, plot)."""

from __future__ import annotations

EPILOG = "Examples:\n\n  mlxcel bench --prompt-lookup --workload prompts.jsonl --json out.json"


def bench() -> None:
    """Benchmark plain vs speculative decoding on a workload (table, JSON, width sweep, plot)."""
    from .. import ui
    from ..errors import MlxcelError

    with ui.exit_on_error():
        raise MlxcelError("mlxcel bench is not implemented yet")
