"""Rendering a result for people: what failed, on which call and case, what came back, what was
expected, the diagnosis and its fix; then a summary line and a progress bar."""
from __future__ import annotations

import shlex
from pathlib import Path

import click

from .manifest import KATAS_DIR, Kata

MARKS = {"passed": ("✓", "green"), "failed": ("✗", "red"), "error": ("!", "red"), "skipped": ("-", "yellow")}
LABELS = ("call", "case", "where", "got", "expected")
HIDDEN = " [hidden]"
BAR = 20


def _points(x: float) -> str:
    return f"{x:g}"


def bar(done: int, total: int, width: int = BAR) -> str:
    filled = round(width * done / total) if total else 0
    return "█" * filled + "░" * (width - filled)


def replay(kata: Kata, seed: int, file: Path | None = None) -> str:
    """The command that grades again with the same inputs: the file named where it is not the
    workspace's own (an interview's, a notebook, a scratch file)."""
    named = f" --file {shlex.quote(str(file))}" if file is not None else ""
    own = kata.dir.parent != KATAS_DIR   # a course's own kata, outside the kit (or a student bundle)
    course = f" --katas-dir {shlex.quote(str(kata.dir.parent))}" if own else ""
    return f"kata{course} check {kata.slug}{named} --seed {seed}"


def graded_cells(result: dict) -> str | None:
    """Which cells of a notebook a result graded, as a sentence (None: no notebook was graded)."""
    cells = result.get("cells")
    if not cells:
        return None
    listed = ", ".join(map(str, cells[:-1])) + f" and {cells[-1]}" if len(cells) > 1 else str(cells[0])
    return (f"Graded: cell{'s' * (len(cells) > 1)} {listed} of {Path(result['file']).name}, your code cells in order "
            "(the test and check cells left out).")


def render(result: dict, kata: Kata, *, replay_with: str | None = None, withhold_fixes: bool = False) -> str:
    """``replay_with``: what replays this run, where it is not `kata check KATA --seed N`.
    ``withhold_fixes``: each diagnosis is explained without its fix (the class policy of that name
    does the same for a class's feedback; an interview's checks do it too)."""
    lines = [click.style(f"{kata.slug} · {kata.title}", bold=True)
             + f"   seed {result['seed']} · {result['device']} · {result['duration_s']:.2f} s · {result['file']}"]
    if result.get("cells"):
        lines += _indent(graded_cells(result), 2)
    status = result["status"]
    if status == "error":
        first = result["checks"][0]["message"] if result["checks"] else ""
        lines += ["", click.style("  Your file could not be graded.", fg="red", bold=True), *_indent(first, 4)]
    elif status == "not-started":
        lines += ["", "  Not started: every check reached code that still raises NotImplementedError.",
                  f"  Edit {kata.learner_file} and run `kata check {kata.slug}` again; `kata hint {kata.slug}` helps."]
    else:
        lines.append("")
        width = max(len(c["id"]) for c in result["checks"])
        tagged = any(c.get("visibility") == "hidden" for c in result["checks"])
        # A diagnosis several checks give is explained once, at the first, which names the others.
        given: dict[str, list[str]] = {}
        for check in result["checks"]:
            if check["status"] in ("failed", "error") and check.get("diagnosis"):
                given.setdefault(check["diagnosis"], []).append(check["id"])
        for check in result["checks"]:
            lines += check_lines(check, kata, width, tagged=tagged, given=given, withhold_fixes=withhold_fixes)
    counted = [c for c in result["checks"] if c["status"] != "skipped"]
    passed = sum(c["status"] == "passed" for c in counted)
    colour = {"passed": "green", "failed": "red", "error": "red", "not-started": "yellow"}[status]
    lines += ["", f"  {click.style(status.upper(), fg=colour, bold=True)}  "
                  f"{_points(result['score'])}/{_points(result['max_score'])} points  "
                  f"{bar(passed, len(counted))}  {passed} of {len(counted)} checks passed"]
    hidden = sum(c["status"] == "skipped" and c.get("visibility") == "hidden" for c in result["checks"])
    skipped = len(result["checks"]) - len(counted) - hidden
    if hidden:
        lines.append(f"  {hidden} hidden check(s) run when your instructor grades; they do not count here.")
    if skipped:
        lines.append(f"  {skipped} check(s) skipped (see above); they do not count here.")
    if result["diagnoses"]:
        lines.append(f"  Diagnoses: {', '.join(result['diagnoses'])}")
    if status in ("failed", "error"):
        lines.append(f"  Replay exactly this run: {replay_with or replay(kata, result['seed'])}")
    return "\n".join(lines)


def check_lines(check: dict, kata: Kata, width: int = 0, *, tagged: bool = False,
                given: dict[str, list[str]] | None = None, withhold_fixes: bool = False) -> list[str]:
    """One check's lines. ``tagged``: some check of the run is hidden, so every name leaves room
    for the tag. ``given``: the checks each diagnosis was given on, in order (see ``render``)."""
    mark, colour = MARKS[check["status"]]
    points = ("not counted" if check["status"] == "skipped" else
              f"{_points(check['score'])}/{_points(kata.checks.get(check['id'], check['max_score']))}")
    # Hidden checks draw fresh inputs at grading: the label says why a replay may differ there.
    hidden = check.get("visibility") == "hidden"
    tag = click.style(HIDDEN, fg="magenta") if hidden else " " * len(HIDDEN) * tagged
    lines = [f"  {click.style(mark, fg=colour)} {check['id']:<{width}}{tag}  {check['name']}  "
             f"{click.style(points, dim=True)}"]
    if check["status"] == "passed":
        return lines + [f"      {click.style('note', fg='cyan')}      {line}" for line in check["message"].splitlines()]
    if check["status"] == "skipped":
        return lines + [f"      skipped: {check['message']}"]
    message, *details = check["message"].splitlines()
    lines += _indent(message, 6)
    for line in details:
        label, sep, value = line.partition(": ")
        if sep and label in LABELS:
            lines.append(f"      {click.style(f'{label:<9}', dim=True)} {value}")
        else:
            lines.append(f"      {line}")
    code = check.get("diagnosis")
    if code:
        diagnosis = kata.diagnoses.get(code)
        on = (given or {}).get(code, [check["id"]])
        first, others = on[0], [name for name in on if name != on[0]]
        label = f"      {click.style('diagnosis', fg='yellow')} {click.style(code, fg='yellow', bold=True)}"
        if check["id"] != first:
            lines.append(f"{label}  (explained above, at {first})")
        else:
            lines.append(label + (f"  (also given on {', '.join(others)})" if others else ""))
            if diagnosis:
                lines += _indent(diagnosis.explain, 16)
                if not withhold_fixes:
                    lines.append(f"      {'fix':<9} {diagnosis.fix}")
    if check.get("output"):
        lines.append(f"      {'printed':<9} (your code's output during this check)")
        lines += _indent(check["output"].rstrip()[:2000], 16)
    return lines


def _indent(text: str, n: int) -> list[str]:
    return [" " * n + line for line in str(text).splitlines()]
