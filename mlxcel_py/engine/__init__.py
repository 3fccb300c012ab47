"""The speculative engine, in token ids: the round loop (generation), verify rounds and the
acceptance rules (verify), token decisions (sampling), draft policies (policy), one sequence's
caches with exact rollback (cache), finished requests' caches (prompt_cache), batched forwards
for serve -np N (batch), a full window shifted (context_shift), counters (stats), text on top
of tokens (text) and the
--verify-exact report (exactness). Nothing here knows a drafter's kind, a command or HTTP."""
