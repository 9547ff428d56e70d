"""The learner's history (``.kata/history.jsonl``) and what to practise next.

One JSON object per line, appended and never rewritten: ``{"type": "check", ...}`` for every
graded run of a kata (``kata check``, ``kata watch``, the checks of a mock interview) and
``{"type": "interview", ...}`` for each mock interview's scorecard. A line that cannot be read (a
crash mid-write, a hand edit) is skipped and counted, never fatal.

What to practise next is first the next kata on the learner's path: the track (manifest.TRACKS) of
the kata last checked, then the next track (``path``). Then spaced repetition over the checks,
Leitner style: each day a kata is passed with new code (a file whose content has not passed
before, such as a fresh attempt after `kata reset` or in an interview) moves it up a box, and a
failed check sends it back to the first. A pass right after a failure puts the kata in the first
box. A kata in box n is due for review 2^(n-1) days after its last pass (1, 2, 4, 8 ... days, at
most 60). Re-checking the same passing file proves nothing new, so it does not count.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path

from ..engine.manifest import NO_TRACK, TRACKS, Kata, by_track

MAX_INTERVAL_DAYS = 60
GRADED = ("passed", "failed", "error")   # the statuses of a graded run (not the untouched stub's)


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
        if p is None or status not in GRADED:
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


def last_worked(katas: tuple[Kata, ...], checks: list[dict]) -> Kata | None:
    """The kata of the last graded run (a scratch file's or the untouched stub's do not count)."""
    known = {k.slug: k for k in katas}
    for entry in reversed(checks):
        if entry.get("kata") in known and not entry.get("scratch") and entry.get("status") in GRADED:
            return known[entry["kata"]]
    return None


def path(katas: tuple[Kata, ...], here: Kata | None, track: str | None = None) -> list[Kata]:
    """The katas in the order the learner walks them from ``here``, the kata last worked on: the
    rest of its track, then the katas of that track before it, then the later tracks in order, then
    the earlier ones, nearest first (a learner who began further on knows the first tracks best).
    ``track``: that track's katas only, from ``here`` where it is one of them."""
    groups = [members for _, members in by_track(katas)] if track is None else \
        [[k for k in katas if k.track == track]]
    current = next((i for i, members in enumerate(groups) if here in members), 0)
    members = groups[current]
    at = members.index(here) if here in members else 0
    walk = [members[at:] + members[:at], *groups[current + 1:], *reversed(groups[:current])]
    return [kata for group in walk for kata in group]


def suggestions(katas: tuple[Kata, ...], checks: list[dict], started: set[str],
                today: date | None = None, track: str | None = None) -> list[Suggestion]:
    """Every kata (of ``track`` only, where given), most urgent first: the next on the path the
    learner is on (``path``: the first kata on it not passed yet, from the kata of the last graded
    run); recently failed; started but never passed; passed and due for review (most overdue
    first); not started (along the path); the rest by due date."""
    today = today or date.today()
    found = progress(katas, checks)
    here = last_worked(katas, checks)
    ahead = [found[k.slug] for k in path(katas, here, track)]
    failed = sorted((p for p in ahead if p.last_status in ("failed", "error")), key=lambda p: p.last_time, reverse=True)
    fresh = [p for p in ahead if not p.passed and p not in failed]
    passed = sorted((p for p in ahead if p.passed and p not in failed), key=lambda p: p.due)
    ranked = []
    for p in failed:
        ranked.append(Suggestion(p.kata, f"failed {_ago(p.last_time.date(), today)} "
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
    going_on = next((p for p in ahead if not p.passed), None)
    if going_on is None or (here is None and track is None):   # no path to go on: nothing worked on yet
        return ranked
    first = next(s for s in ranked if s.kata == going_on.kata)
    ranked.remove(first)
    return [Suggestion(going_on.kata, _going_on(going_on.kata, here, found, first.reason, track), first.command),
            *ranked]


def _going_on(kata: Kata, here: Kata | None, found: dict[str, Progress], reason: str, track: str | None) -> str:
    """Why ``kata`` is the next on the learner's path from ``here``."""
    if kata == here:   # the last graded run failed: the path goes on from there once it passes
        return f"{reason}, then go on along {_called(kata.track)}"
    begun = any(p.passed for p in found.values() if p.kata.track == kata.track) or (here and here.track == kata.track)
    said = f"{'continues' if begun else 'starts'} {_called(kata.track)}"
    if track is not None or here is None or here.track == kata.track:
        return said
    names = [t.name for t in (*TRACKS, NO_TRACK)]
    if names.index(here.track) < names.index(kata.track):
        return f"{said}: {_called(here.track)} is done"
    return f"{said}: every track after it is done"


def _called(track: str) -> str:
    return f"the {track} track" if track else "the katas of no track"


def _ago(day: date, today: date) -> str:
    days = (today - day).days
    return "today" if days == 0 else "yesterday" if days == 1 else f"{days} days ago"
