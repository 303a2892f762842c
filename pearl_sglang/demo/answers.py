"""Does a join or leave answer match the cluster? Checked against ``/pearl/state`` read
right after the answer, so a trace replay fails on a wrong answer instead of hiding it
behind good throughput (docs/admin-api.md says what each answer promises).

Pure: the replayer fetches the table and calls these. Only the answered GPUs are
looked at, and the replayer alone joins and leaves them, so other events between the
answer and the read (other nodes' joins and leaves, training) do not change them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pearl_rl_adapter import GpusJoined, GpusLeft

_MEMBER = frozenset({"active", "joining", "switching"})


@dataclass
class AnswerLog:
    """Join and leave answers seen by a trace replayer, and the wrong ones."""

    joins: int = 0
    leaves: int = 0
    superseded_joins: int = 0   # answered after a later event's growth took over theirs
    wrong: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"joins": self.joins, "leaves": self.leaves, "superseded_joins": self.superseded_joins,
                "wrong": list(self.wrong)}


def _on(table: Mapping[str, Any], gpus: Sequence[str]) -> list[Mapping[str, Any]]:
    wanted = set(gpus)
    return [w for w in table["workers"] if w["role"] != "training" and wanted & set(w["gpus"])]


def check_join(answer: GpusJoined, gpus: Sequence[str], table: Mapping[str, Any]) -> str | None:
    """None when the answer is true of the table, else what is wrong with it."""
    serving = sorted(str(w["slot"]) for w in _on(table, gpus) if w["activity"] == "active")
    if answer.admitted and answer.cancelled:
        return f"join of {list(gpus)}: admitted {list(answer.admitted)} and cancelled at once"
    if sorted(answer.admitted) != serving:
        return (f"join of {list(gpus)} answered admitted={list(answer.admitted)} cancelled={answer.cancelled} "
                f"({answer.reason}), but the workers serving on them are {serving}")
    if not answer.admitted and not answer.reason:
        return f"join of {list(gpus)}: nothing admitted and no reason given"
    coming = sorted(str(w["slot"]) for w in _on(table, gpus) if w["activity"] in ("joining", "switching"))
    if not answer.admitted and coming:
        # An answer that comes while a growth is still making workers ready on the GPUs
        # did not wait for what happens to them (they are admitted moments later).
        return (f"join of {list(gpus)} answered cancelled={answer.cancelled} ({answer.reason}) while slots "
                f"{coming} were being made ready on them")
    return None


def check_leave(answer: GpusLeft, gpus: Sequence[str], table: Mapping[str, Any]) -> str | None:
    """None when the GPUs are free and gone from the budget after the leave answered."""
    held = sorted(str(w["slot"]) for w in _on(table, gpus) if w["activity"] in _MEMBER)
    if held:
        return f"leave of {list(gpus)} answered (removed {list(answer.removed)}), but slots {held} still hold them"
    kept = sorted(set(gpus) & set(table["dedicated_gpus"]))
    if kept:
        return f"leave of {list(gpus)} answered, but {kept} are still in the budget"
    return None
