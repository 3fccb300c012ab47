"""A drafter kind written as a user would add one (#48): this module and a registry row, nothing
else. It proposes what followed the newest token's previous occurrence (a one-token lookup)."""

from __future__ import annotations

from collections.abc import Sequence

from mlxcel_py.drafters.base import Drafter, DrafterSource, Plan


class EchoDrafter(Drafter):
    kind = "toy"

    def draft(self, context: Sequence[int], k: int) -> list[int]:
        last = context[-1]
        for i in range(len(context) - 2, -1, -1):
            if context[i] == last:
                return list(context[i + 1 : i + 1 + k])
        return []


class Source(DrafterSource):
    def new_drafter(self) -> EchoDrafter:
        return EchoDrafter()


def prepare(draft, target, model_options) -> Plan:
    return Plan(draft, lambda loaded, say: Source.of(draft, loaded))
