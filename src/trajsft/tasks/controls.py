"""The controls every task set is held to before a model is graded on it (SWE-smith's): the gold fix (the bug patch
reversed) must resolve each task and the empty patch none; a task that fails its control is excluded, with its
reason, never silently graded."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from . import grade as G
from .record import Task
from .sandbox import Limits


@dataclass
class Checked:
    """A set's controls: per task the gold and empty rows, and the tasks excluded with why."""

    rows: list[dict] = field(default_factory=list)  # instance_id, gold, empty (Graded rows), excluded (a reason)
    excluded: dict[str, str] = field(default_factory=dict)

    @property
    def kept(self) -> list[str]:
        return [r["instance_id"] for r in self.rows if r["instance_id"] not in self.excluded]

    def counts(self) -> tuple[int, int, int]:
        """(gold resolved, empty resolved, tasks)."""
        return (sum(r["gold"]["resolved"] for r in self.rows), sum(r["empty"]["resolved"] for r in self.rows),
                len(self.rows))


def check(tasks: list[Task], repos: Path, *, sandbox: str = "bubblewrap", limits: Limits = Limits()) -> Checked:
    out = Checked()
    for t in tasks:
        gold = G.grade(t, G.gold_patch(t, repos), repos, sandbox=sandbox, limits=limits)
        empty = G.grade(t, "", repos, sandbox=sandbox, limits=limits)
        why = []
        if not gold.resolved:
            why.append("the gold fix does not resolve it" + (f" ({gold.reason})" if gold.reason else ""))
        if empty.resolved:
            why.append("the empty patch resolves it")
        if why:
            out.excluded[t.instance_id] = "; ".join(why)
        out.rows.append({"instance_id": t.instance_id, "gold": gold.row(), "empty": empty.row(),
                         "excluded": out.excluded.get(t.instance_id)})
    return out
