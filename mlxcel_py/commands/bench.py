"""Benchmark plain vs speculative decoding on a workload (table, JSON, width sweep, plot)."""

from __future__ import annotations

from pathlib import Path

from ..cpu import blas
from ..terminal import ui
from ._options import BENCH_PARAMS, build_bench_options, build_options
from ._signature import with_params

EPILOG = (
    "Examples:\n\n"
    "  mlxcel bench\n\n"
    "  mlxcel bench --workload prompts.jsonl --max-tokens 256 --markdown\n\n"
    "  mlxcel bench --sweep-widths 1,2,4,7,12 --plot widths.png --json bench.json\n\n"
    "  mlxcel bench -m ./Llama-3.1-8B --draft-model ./Llama-3.2-1B --vs mlx-lm"
)


@with_params(BENCH_PARAMS)
def bench(**params) -> None:
    """Benchmark plain vs speculative decoding on a workload (table, JSON, width sweep, plot)."""
    from ..bench import workload
    from ..bench.checks import validate_bench
    from ..errors import UsageError

    with ui.exit_on_error():
        plan = validate_bench(build_options("bench", params), build_bench_options(params))
        b = plan.bench
        if b.trace and b.workload:
            raise UsageError("--trace and --workload each name what to run; pass one")
        traces = workload.load_traces(Path(b.trace))[: b.limit] if b.trace else None
        items = (
            []
            if traces
            else workload.limit_per_kind(workload.load(Path(b.workload)) if b.workload else workload.builtin(), b.limit)
        )
        for flag, path in (("--json", b.json_path), ("--plot", b.plot_path)):
            if path and not Path(path).resolve().parent.is_dir():  # found out now, not after the whole run
                raise UsageError(
                    f"{flag} {path}: the folder {Path(path).resolve().parent} does not exist; "
                    f"create it or pick another path"
                )
        if plan.widths:
            from ..bench import plot as bench_plot

            bench_plot.require()
        blas.prepare(plan.run.options.model.blas)
        from ..bench.driver import run_bench

        run_bench(plan, items, traces)
