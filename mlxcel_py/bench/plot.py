"""The width-sweep plot of `mlxcel bench --sweep-widths` (matplotlib, PNG, no display needed).

Left: mean accepted prefix and useful tokens per verify against width, per drafter (the seed
page's advice: plot these, not acceptance alone). Right: median speedup over plain decoding
against width, one line per workload kind plus all prompts, with the recommended width marked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..errors import MlxcelError
from .report import SummaryRow, WidthChoice
from .runner import ALL_KINDS


def require() -> None:
    """Refuse --sweep-widths up front (before any model loads) when matplotlib is missing."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise MlxcelError(
            "--sweep-widths plots with matplotlib, which is not installed; "
            "pip install 'mlxcel-py[plot]' (or drop --sweep-widths)"
        )


def plot_sweep(rows: Sequence[SummaryRow], choices: Sequence[WidthChoice], path: Path, *, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drafters = sorted({r.config.split(" k=")[0] for r in rows})
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for d in drafters:
        mine = sorted((r for r in rows if r.kind == ALL_KINDS and r.config.startswith(d)), key=lambda r: r.width)
        xs = [r.width for r in mine]
        left.plot(xs, [r.mean_accepted_prefix for r in mine], marker="o", label=f"{d}: mean accepted prefix")
        left.plot(
            xs, [r.tokens_per_verify for r in mine], marker="s", linestyle="--", label=f"{d}: useful tokens / verify"
        )
        kinds = sorted({r.kind for r in rows if r.kind != ALL_KINDS})
        for kind in kinds + [ALL_KINDS]:
            sel = sorted((r for r in rows if r.kind == kind and r.config.startswith(d)), key=lambda r: r.width)
            right.plot(
                [r.width for r in sel],
                [r.speedup for r in sel],
                marker="o",
                linewidth=2.5 if kind == ALL_KINDS else 1.2,
                label=f"{d}: {kind}" if len(drafters) > 1 else kind,
            )
    for c in choices:
        right.axvline(c.width, color="grey", linestyle=":", linewidth=1)
        right.annotate(
            f"{c.drafter}: {c.width}", (c.width, c.speedup), textcoords="offset points", xytext=(4, 6), fontsize=8
        )
    right.axhline(1.0, color="black", linewidth=0.8)
    left.set(xlabel="proposal width (drafted tokens per round)", ylabel="tokens", title="Accepted work per verify")
    right.set(xlabel="proposal width (drafted tokens per round)", ylabel="median speedup vs plain (x)", title="Speedup")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
