"""Summary line and `--profile` table for one generation (stderr)."""

from __future__ import annotations

from ..engine.stats import GenerationStats
from ..terminal import ui


def summary_lines(st: GenerationStats, elapsed_s: float, *, profile: bool = False) -> list[str]:
    """mlxcel's lines: `[Generated ...]` (only without --profile, as mlxcel), `[Prompt lookup] ...`
    for prompt lookup, `[Speculative acceptance] ...` for every drafter."""
    rate = st.generated_tokens / elapsed_s if elapsed_s > 0 else 0.0
    lines = [] if profile else [f"[Generated {st.generated_tokens} tokens in {elapsed_s:.2f}s = {rate:.2f} tok/s]"]
    if st.draft_kind == "prompt-lookup":
        lines.append(st.lookup_summary_line())
    if st.draft_kind:
        lines.append(st.acceptance_summary_line())
    return lines


def print_profile(st: GenerationStats, session, *, finish_reason: str | None) -> None:
    """mlxcel's `[Profile Results]` block and `[TTFT]` line, then our table of the rest."""
    for line in (
        "[Profile Results]",
        f"  Prompt tokens:    {st.prompt_tokens}",
        f"  Generated tokens: {st.generated_tokens}",
        f"  Prefill:          {st.prefill_s * 1000:.2f} ms ({st.prefill_tps:.2f} tok/s)",
        f"  Decode:           {st.decode_s * 1000:.2f} ms ({st.decode_tps:.2f} tok/s)",
        f"[TTFT] {st.ttft_s * 1000:.2f} ms",
    ):
        ui.info(line)
    ms = lambda s: f"{s * 1000:.2f} ms"  # noqa: E731
    rows = []  # prompt and generated tokens, prefill, decode and TTFT are in mlxcel's block above
    if st.draft_kind:  # counted as mlxcel's [Prompt lookup] / [Speculative acceptance] lines count them
        rows += [
            ("Drafter", f"{st.draft_kind} (policy {st.policy})"),
            ("Acceptance rule", str(st.acceptance_rule)),
            ("Rounds", str(st.decode_rounds)),  # target forwards after the one that gave the first token
            ("Drafted rounds", str(st.drafted_rounds)),
            ("Paused rounds", str(st.paused_rounds)),
            ("Proposed", str(st.proposed)),
            ("Accepted", str(st.accepted)),
            ("Acceptance rate", f"{st.acceptance_rate:.4f}"),
            ("Positions tested", str(st.positions_tested)),
            ("Mean accepted prefix", f"{st.mean_accepted_prefix:.4f}"),
            ("Tokens per forward", f"{st.tokens_per_forward:.4f}"),
            ("Draft", ms(st.draft_s)),
            ("Verify", ms(st.verify_s)),
            ("Rollback", ms(st.rollback_s)),
        ]
        if st.tree_rounds:  # draft trees (engine/tree.py): rounds that verified one, and took a branch
            rows += [("Tree rounds", str(st.tree_rounds)), ("Branch accepts", str(st.branch_accepts))]
    rows += [
        ("Warmup", ms(st.warmup_s)),
        ("Cached prompt tokens", str(st.cached_tokens)),
        ("Peak memory", f"{st.peak_memory_bytes / 2**20:.1f} MiB"),
        ("Finish reason", str(finish_reason)),
        # in full on the `loaded in` line above (with the kernels)
        ("Weights", session.target.dtype.split(" (")[0]),
        ("KV cache", session.target.kv_summary),
        ("BLAS", session.blas.name),
    ]
    world = getattr(session, "world", None)
    if world is not None and world.channel is not None:
        rows.append(
            (
                "Distributed",
                f"{world.layout.describe()}, {world.size} ranks ({world.backend}); "
                f"rank 0 sent+received {world.channel.describe_traffic()}",
            )
        )
    ui.profile_table(rows)
