"""The learner's history (``.kata/history.jsonl``) and what to practise next.

One JSON object per line, appended and never rewritten: ``{"type": "check", ...}`` for every
graded run of a kata (``kata check``, ``kata watch``, the checks of a mock interview) and
``{"type": "interview", ...}`` for each mock interview's scorecard. A line that cannot be read (a
crash mid-write, a hand edit) is skipped and counted, never fatal.

What to practise next is spaced repetition over the checks, Leitner style: each day a kata is
passed with new code (a file whose content has not passed before, such as a fresh attempt after
`kata reset` or in an interview) moves it up a box, and a failed check sends it back to the first.
A pass right after a failure puts the kata in the first box. A kata in box n is due for review 2^(n-1) days after its last pass (1, 2, 4, 8 ... days, at most
60). Re-checking the same passing file proves nothing new, so it does not count.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path

from ..engine.manifest import Kata

MAX_INTERVAL_DAYS = 60


def now() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


class History:
    def __init__(self, path: Path):
        self.path = path
        self.skipped = 0   # unreadable lines

    def append(self, entry: dict):
        """Add one entry; a single write of one line, so a crash leaves at most one bad line."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = (json.dumps({"time": now(), **entry}, sort_keys=True) + "\n").encode()
        with open(self.path, "a+b") as f:
            end = f.tell()
            if end and os.pread(f.fileno(), 1, end - 1) != b"\n":
                line = b"\n" + line   # after a torn last line, start a new one
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def entries(self, kind: str | None = None) -> list[dict]:
        if not self.path.exists():
            return []
        found, self.skipped = [], 0
        for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                datetime.fromisoformat(entry["time"])
            except (ValueError, KeyError, TypeError):
                self.skipped += 1
                continue
            if kind is None or entry.get("type") == kind:
                found.append(entry)
        return found


@dataclass
class Progress:
    """One kata as the history sees it."""
    kata: Kata
    checks: int = 0
    not_started: int = 0                     # runs of the untouched stub (not counted in checks)
    scratch: int = 0                         # runs of scratch files (--file), counted nowhere else
    passed: bool = False
    best: float = 0.0
    best_max: float = 0.0                    # the most the best run could score (its device's)
    last_status: str | None = None
    last_time: datetime | None = None       # last graded run (not-started runs excluded)
    last_pass: datetime | None = None
    box: int = 0                             # Leitner box: new passing attempts on distinct days

    @property
    def interval_days(self) -> int:
        return min(2 ** (self.box - 1), MAX_INTERVAL_DAYS) if self.box else 0

    @property
    def due(self) -> date | None:
        if self.last_pass is None or not self.box:
            return None
        return self.last_pass.date() + timedelta(days=self.interval_days)


def progress(katas: tuple[Kata, ...], checks: list[dict]) -> dict[str, Progress]:
    """Every kata's progress from the check entries, oldest first."""
    found = {k.slug: Progress(k) for k in katas}
    passed_files: dict[str, set] = {k.slug: set() for k in katas}
    last_box_day: dict[str, date] = {}
    for entry in checks:
        p = found.get(entry.get("kata"))
        status = entry.get("status")
        if p is not None and entry.get("scratch"):
            p.scratch += 1
            continue
        if p is not None and status == "not-started":
            p.not_started += 1
        if p is None or status not in ("passed", "failed", "error"):
            continue
        when = datetime.fromisoformat(entry["time"])
        p.checks += 1
        p.last_status, p.last_time = status, when
        score, most = float(entry.get("score", 0.0)), float(entry.get("max_score") or p.kata.max_score)
        if not p.best_max or score / most > p.best / p.best_max:
            p.best, p.best_max = score, most
        if status != "passed":
            p.box = 0
            last_box_day.pop(p.kata.slug, None)
            continue
        p.passed, p.last_pass = True, when
        fresh = entry.get("sha256") not in passed_files[p.kata.slug]
        passed_files[p.kata.slug].add(entry.get("sha256"))
        if p.box == 0 or (fresh and last_box_day.get(p.kata.slug) != when.date()):
            p.box += 1
            last_box_day[p.kata.slug] = when.date()
    return found


@dataclass
class Suggestion:
    kata: Kata
    reason: str
    command: str


def suggestions(katas: tuple[Kata, ...], checks: list[dict], started: set[str],
                today: date | None = None) -> list[Suggestion]:
    """Every kata, most urgent first: recently failed; started but never passed; passed and due
    for review (most overdue first); not started (in the katas' order); the rest by due date."""
    today = today or date.today()
    found = progress(katas, checks)
    failed = sorted((p for p in found.values() if p.last_status in ("failed", "error")),
                    key=lambda p: p.last_time, reverse=True)
    fresh = [p for p in found.values() if not p.passed and p not in failed]
    passed = sorted((p for p in found.values() if p.passed and p not in failed), key=lambda p: p.due)
    ranked = []
    for p in failed:
        ranked.append(Suggestion(p.kata, f"failed { _ago(p.last_time.date(), today)} "
                                         f"(best {p.best:g}/{p.best_max:g}): fix it while it is fresh",
                                 f"kata check {p.kata.slug}"))
    for p in fresh:
        if p.kata.slug in started or p.checks:
            ranked.append(Suggestion(p.kata, "started, never passed", f"kata check {p.kata.slug}"))
    for p in passed:
        if p.due <= today:
            every = f"{p.interval_days} day{'s' * (p.interval_days != 1)}"
            ranked.append(Suggestion(p.kata, f"passed, last {_ago(p.last_pass.date(), today)}; due for review "
                                             f"(every {every}): solve it again from scratch",
                                     f"kata interview --katas {p.kata.slug}"))
    for p in fresh:
        if not (p.kata.slug in started or p.checks):
            ranked.append(Suggestion(p.kata, "not started yet", f"kata start {p.kata.slug}"))
    for p in passed:
        if p.due > today:
            ranked.append(Suggestion(p.kata, f"passed, last {_ago(p.last_pass.date(), today)}; "
                                             f"next review due {p.due.isoformat()}",
                                     f"kata interview --katas {p.kata.slug}"))
    return ranked


def _ago(day: date, today: date) -> str:
    days = (today - day).days
    return "today" if days == 0 else "yesterday" if days == 1 else f"{days} days ago"
