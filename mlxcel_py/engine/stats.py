"""Counters and timings of one generation, and the derived figures `--profile` and `timings` show."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from a reused cache
    generated_tokens: int = 0
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    decode_s: float = 0.0
    peak_memory_bytes: int = 0
    # speculation
    draft_kind: str | None = None
    policy: str | None = None
    acceptance_rule: str | None = None
    rounds: int = 0  # target forwards after prefill (plain steps and verify rounds)
    drafted_rounds: int = 0
    paused_rounds: int = 0
    proposed: int = 0
    positions_tested: int = 0  # draft positions compared with the target (a rejection ends a round's)
    accepted: int = 0  # accepted draft tokens that were emitted
    draft_s: float = 0.0
    verify_s: float = 0.0
    rollback_s: float = 0.0
    shadow_confirmations: int = 0
    tree_rounds: int = 0  # verify rounds of a draft tree (engine/tree.py); the rest verified chains
    branch_accepts: int = 0  # tree rounds whose accepted path left the tree's first chain
    warmup_s: float = 0.0
    context_shifts: int = 0  # times a full window was shifted (engine/context_shift.py)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted_prefix(self) -> float:
        return self.accepted / self.drafted_rounds if self.drafted_rounds else 0.0

    @property
    def predicted_s(self) -> float:
        """Time spent generating, llama-server's `predicted_ms`: from the prompt's end, so the
        first token's forward counts here and not as prompt time."""
        return max(self.decode_s - self.ttft_s + self.prefill_s, 0.0) if self.generated_tokens else 0.0

    @property
    def decode_rounds(self) -> int:
        """Target forwards after the first one, which ends the prompt and yields the first token
        (mlxcel's prefill does that; here it may verify drafts too)."""
        return max(self.rounds - 1, 0)

    @property
    def tokens_per_forward(self) -> float:
        """mlxcel's: (generated - 1) / decode rounds, 0 when there are none."""
        return (self.generated_tokens - 1) / self.decode_rounds if self.decode_rounds else 0.0

    @property
    def per_position_acceptance(self) -> float:
        return self.accepted / self.positions_tested if self.positions_tested else 0.0

    @property
    def prefill_tps(self) -> float:
        n = self.prompt_tokens - self.cached_tokens
        return n / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        return self.generated_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def lookup_summary_line(self) -> str:
        """mlxcel's `[Prompt lookup] ...` line (rounds and tokens_per_forward over decode forwards)."""
        return (
            f"[Prompt lookup] rounds={self.decode_rounds} drafted_rounds={self.drafted_rounds} "
            f"paused_rounds={self.paused_rounds} proposed={self.proposed} accepted={self.accepted} "
            f"acceptance_rate={self.acceptance_rate:.4f} tokens_per_forward={self.tokens_per_forward:.4f} "
            f"shadow_confirmations={self.shadow_confirmations}"
        )

    def acceptance_summary_line(self) -> str:
        """mlxcel's `[Speculative acceptance] ...` line (rounds: verify rounds), our drafter kind last."""
        return (
            f"[Speculative acceptance] rule={self.acceptance_rule} rounds={self.drafted_rounds} "
            f"proposed={self.proposed} positions_tested={self.positions_tested} accepted={self.accepted} "
            f"per_position_acceptance={self.per_position_acceptance:.4f} acceptance_rate={self.acceptance_rate:.4f} "
            f"mean_accepted_len={self.mean_accepted_prefix:.4f} kind={self.draft_kind}"
        )
