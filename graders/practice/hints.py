"""Which hint comes next: the one aimed at what the last check run failed.

Each hint of a manifest names the checks and diagnosis codes it helps with (its ``for``). A
diagnosis names the mistake, so the next hint is the first unseen one, in the manifest's order,
for the first diagnosis the last run gave; once those are seen, for the checks that gave a
diagnosis, then for the other checks it failed, in the run's order. Task order is only for a
kata whose last run failed nothing (or that has no run). `kata hint` and `kata interview` both
choose this way.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..engine.manifest import Kata


def failed_checks(result: dict) -> list[list]:
    """The checks a run failed, in its order, each as [check id, diagnosis code or None]."""
    return [[check["id"], check.get("diagnosis")] for check in result["checks"]
            if check["status"] in ("failed", "error")]


@dataclass(frozen=True)
class Choice:
    index: int | None   # into kata.hints; None: no unseen hint serves what failed (or none is left)
    check: str | None   # the failed check it is for; None: task order (nothing failed)
    code: str | None = None   # the diagnosis it is for, where it was chosen for one


def choose(kata: Kata, seen: set[int], failed: list[list]) -> Choice:
    hints = kata.hints
    diagnosed = [(check, code) for check, code in failed if code]
    wanted = ([(check, code, code) for check, code in diagnosed] + [(check, None, check) for check, _ in diagnosed]
              + [(check, None, check) for check, code in failed if not code])
    for check, code, name in wanted:
        for i, hint in enumerate(hints):
            if i not in seen and name in hint.serves:
                return Choice(i, check, code)
    if failed:
        return Choice(None, failed[0][0])
    return Choice(next((i for i in range(len(hints)) if i not in seen), None), None)


def heading(kata: Kata, choice: Choice) -> str:
    """The line above a chosen hint: its number, the check it is for, and its task."""
    task = kata.task_of(kata.hints[choice.index])
    aim = f" for the failed check `{choice.check}`" if choice.check else ""
    aim += f", diagnosed `{choice.code}`" if choice.code else ""
    return f"Hint {choice.index + 1}/{len(kata.hints)}{aim} (task {task}: {kata.tasks[task - 1].title})"


def none_left(kata: Kata, failed: list[list]) -> str:
    """What to say when ``choose`` found no hint."""
    if failed:
        names = ", ".join(f"`{check}`" for check, _ in failed)
        return f"You have seen every hint of {kata.slug} for the checks your last run failed ({names})."
    return f"You have seen all {len(kata.hints)} hints of {kata.slug}."
