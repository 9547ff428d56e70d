"""Which hint comes next: the one aimed at what the last check run failed.

Each hint of a manifest names the checks and diagnosis codes it helps with (its ``for``), and each
task the functions and classes of the stub it writes (its ``functions``). A failed check is put down
to the tasks of the functions its report's ``call`` line names, among those whose hints serve it:
a check whose cases call several functions (roofline's ``textbook-answers``) names, in the call
that failed, the one at fault. Where the call names none of them, the check is put down to every
task whose hints serve it. Hints come only from the tasks the failed checks are put down to, so
never from a task whose checks all pass.

A diagnosis names the mistake, so the next hint is the first unseen one for the first diagnosis
the last run gave (from the tasks of its check first, then from the other failing tasks); once
those are seen, for the checks that gave a diagnosis (from the tasks that hold a hint for it first),
then for the other checks it failed, in the run's order, each from its own tasks, those of the
function its call names first.

Task order is for a kata with no run yet, and after a run that failed nothing. That run passed:
the heading says so, and the learner who asks anyway (to read ahead, or to prepare an interview's
follow-ups) gets the next hint in task order rather than a refusal. `kata hint` and `kata interview`
both choose this way.
"""
from __future__ import annotations

import ast
import itertools
import re
from dataclasses import dataclass

from ..engine.manifest import Kata

CALL = re.compile(r"^call: (.*)$", re.MULTILINE)   # the labelled line of CheckFailed.text()
CALL_CHARS = 300   # a call line is a few dozen characters; more is a case, not a call
NAME = re.compile(r"(\.?)\b([A-Za-z_]\w*)")   # a name, and whether it is an attribute (a method)


def failed_checks(result: dict) -> list[list]:
    """The checks a run failed, in its order, each as [check id, diagnosis code or None, the call
    its report names or None]."""
    return [[check["id"], check.get("diagnosis"), _call(check.get("message") or "")] for check in result["checks"]
            if check["status"] in ("failed", "error")]


def _call(message: str) -> str | None:
    found = CALL.search(message)
    return found.group(1)[:CALL_CHARS] if found else None


def called(kata: Kata, call: str | None) -> list[str]:
    """The functions and classes of the kata's tasks that ``call`` names, in its order: a name as
    written (``decode_step(...)``, ``TensorParallelAttention(...)``), a method call
    (``cache.append(...)``) by the stub's classes that define the method."""
    named = {name for task in kata.tasks for name in task.functions}
    if not call or not named:
        return []
    methods = {}   # a public method of the stub's classes -> the classes that define it
    for node in ast.parse(kata.stub_path.read_text(encoding="utf-8")).body:
        for item in node.body if isinstance(node, ast.ClassDef) else ():
            if isinstance(item, ast.FunctionDef) and not item.name.startswith("_"):
                methods.setdefault(item.name, []).append(node.name)
    found = []
    for dot, name in NAME.findall(call):
        for owner in methods.get(name, ()) if dot else (name,):
            if owner in named and owner not in found:
                found.append(owner)
    return found


def put_down_to(kata: Kata, check: str, call: str | None) -> list[int]:
    """The tasks (0-based) a failed ``check`` is put down to, those of the first function its call
    names first (see the module's docstring)."""
    serving = [t for t, task in enumerate(kata.tasks) if any(check in hint.serves for hint in task.hints)]
    names = called(kata, call)
    rank = {t: min((names.index(n) for n in kata.tasks[t].functions if n in names), default=None) for t in serving}
    return sorted((t for t in serving if rank[t] is not None), key=lambda t: (rank[t], t)) or serving


@dataclass(frozen=True)
class Choice:
    index: int | None   # into kata.hints; None: no unseen hint serves what failed (or none is left)
    check: str | None   # the failed check it is for; None: task order (nothing failed)
    code: str | None = None   # the diagnosis it is for, where it was chosen for one
    passed: bool = False   # the last run failed nothing: the next hint in task order, aimed at nothing


def choose(kata: Kata, seen: set[int], failed: list[list] | None) -> Choice:
    """``failed``: the last run's ``failed_checks`` (an entry from before calls were kept has two
    fields), or None where the kata has no run."""
    hints = kata.hints
    if not failed:
        return Choice(next((i for i in range(len(hints)) if i not in seen), None), None, passed=failed is not None)
    first = list(itertools.accumulate((len(task.hints) for task in kata.tasks), initial=0))   # each task's first hint
    checks = [(check, code, put_down_to(kata, check, call[0] if call else None)) for check, code, *call in failed]
    failing = sorted({t for _, _, tasks in checks for t in tasks})

    def holds(t: int, code: str) -> bool:   # task t has a hint for the diagnosis: the mistake is made there
        return any(code in hint.serves for hint in kata.tasks[t].hints)

    # (the check, the diagnosis, the name a hint must serve, the tasks to look in, in order)
    wanted = [(check, code, code, tasks + [t for t in failing if t not in tasks]) for check, code, tasks in checks
              if code]
    wanted += [(check, None, check, sorted(tasks, key=lambda t: not holds(t, code))) for check, code, tasks in checks
               if code]
    wanted += [(check, None, check, tasks) for check, code, tasks in checks if not code]
    for check, code, name, tasks in wanted:
        for t in tasks:
            for i in range(first[t], first[t + 1]):
                if i not in seen and name in hints[i].serves:
                    return Choice(i, check, code)
    return Choice(None, failed[0][0])


def heading(kata: Kata, choice: Choice) -> str:
    """The line above a chosen hint: its number, the check it is for (or that nothing failed), and its task."""
    task = kata.task_of(kata.hints[choice.index])
    aim = f" for the failed check `{choice.check}`" if choice.check else ""
    aim += f", diagnosed `{choice.code}`" if choice.code else ""
    aim += ", the next in task order: your last run passed every check" if choice.passed else ""
    return f"Hint {choice.index + 1}/{len(kata.hints)}{aim} (task {task}: {kata.tasks[task - 1].title})"


def none_left(kata: Kata, failed: list[list] | None) -> str:
    """What to say when ``choose`` found no hint."""
    if failed:
        names = ", ".join(f"`{check}`" for check, *_ in failed)
        return f"You have seen every hint of {kata.slug} for the checks your last run failed ({names})."
    passed = "Your last run passed every check, and you" if failed is not None else "You"
    return f"{passed} have seen all {len(kata.hints)} hints of {kata.slug}."
