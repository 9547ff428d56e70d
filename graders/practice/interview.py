"""Mock interviews (`kata interview`): katas against the clock, then the interviewer's follow-ups.

The seed decides everything that is drawn: the katas (unless given), the follow-up questions,
their parameters, the order of their options and the checks' inputs. The same seed replays the
same interview.

The learner codes in fresh copies of the stubs under ``<workspace>/interviews/<time>/``, never in
their practice files, and may check and ask for hints as often as they like. A check there
withholds the diagnoses' fixes (answer code, which would make the hints pointless); grading the
final answer (`done`, or at time up) shows them. When the clock runs out the files are copied aside
(``at-time-up/``) and those copies are graded: code saved later does not count. The score, out of
100: the coding part is worth CODING_POINTS times the mean fraction of check points at the end,
less HINT_COST per hint served for failing work (never below 0), and the follow-ups
FOLLOWUP_POINTS times the fraction answered right. A hint is for failing work when the last check
failed something, or before the first check (the file is the stub then); one served after a check
that failed nothing costs nothing, and so does being told that no hint is left. The scorecard goes
to the history.
"""
from __future__ import annotations

import random
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import click

from ..engine.bundle import bundle_info
from ..engine.manifest import Kata
from ..engine.questions import Asked, Question, letter
from ..engine.report import render, replay
from ..engine.runner import RunnerError, grade
from . import hints
from .workspace import Workspace

CODING_POINTS, FOLLOWUP_POINTS, HINT_COST = 60, 40, 5
DEFAULT_MINUTES = 30
COMMANDS = "check, hint, task, done, quit"
COMMAND_HELP = ("  check  grade your file, as often as you like\n"
                f"  hint   a hint for what your last check failed (-{HINT_COST} points each; free when it failed "
                "nothing)\n"
                "  task   show the task again\n"
                "  done   grade your file as it is now as your final answer, and go on to the next kata "
                "or the follow-up questions\n"
                "  quit   abandon the interview (it is saved as abandoned)")


@dataclass(frozen=True)
class Plan:
    seed: int
    minutes: float
    katas: tuple[Kata, ...]
    questions: tuple[Asked, ...]
    replay: str     # the command that draws this plan again


def pick(banks: dict[str, tuple[Question, ...]], count: int, rng: random.Random) -> list[Asked]:
    """``count`` questions drawn from the katas' banks (kata slug -> questions): spread over the
    katas in turn, and at least one numeric and one choice question when the banks hold both."""
    pools = {slug: rng.sample(list(bank), len(bank)) for slug, bank in banks.items() if bank}
    chosen = []
    while len(chosen) < count and any(pools.values()):
        for slug in list(pools):
            if pools[slug] and len(chosen) < count:
                chosen.append((slug, pools[slug].pop()))
    kinds = {q.kind for _, q in chosen}
    for wanted in ("numeric", "choice"):
        if wanted in kinds or len(chosen) < 2:
            continue
        spare = [(s, q) for s, pool in pools.items() for q in pool if q.kind == wanted]
        if spare:
            # Every question is of the other kind: swap the last one.
            chosen[-1] = spare[0]
            kinds = {q.kind for _, q in chosen}
    return [q.draw(rng, slug) for slug, q in chosen]


def plan(all_katas: tuple[Kata, ...], *, seed: int, minutes: float | None = None,
         chosen: list[Kata] | None = None) -> Plan:
    """What an interview asks. Unless given, katas are drawn at random to fill the time with
    their manifests' estimates (at least one); 2 + one follow-up per kata, 3 to 5 in all."""
    rng = random.Random(seed)
    if chosen:
        katas = list(chosen)
        minutes = minutes or sum(k.minutes for k in katas)
    else:
        minutes = minutes or DEFAULT_MINUTES
        katas, left = [], minutes
        for kata in rng.sample(list(all_katas), len(all_katas)):
            if kata.minutes <= left:
                katas.append(kata)
                left -= kata.minutes
        katas = sorted(katas, key=lambda k: k.order) or [min(all_katas, key=lambda k: k.minutes)]
    count = min(5, max(3, 2 + len(katas)))
    questions = pick({k.slug: k.followups for k in katas}, count, rng)
    replay = f"kata interview --seed {seed} --minutes {minutes:g}"
    if chosen:
        replay += f" --katas {','.join(k.slug for k in katas)}"
    return Plan(seed, float(minutes), tuple(katas), tuple(questions), replay)


class Abandoned(Exception):
    """The learner quit, or their input ended, before the scorecard."""


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


class Interview:
    def __init__(self, ws: Workspace, plan: Plan, *, device: str = "auto"):
        self.ws, self.plan, self.device = ws, plan, device
        bundle = bundle_info()
        # A student bundle recorded its expected values at one seed: its checks run at that one.
        self.check_seed = bundle["seed"] if bundle else plan.seed
        self.folder = self._new_folder()
        self.limit_s = plan.minutes * 60
        self.seen: dict[str, set[int]] = {k.slug: set() for k in plan.katas}   # the hints taken
        self.failed: dict[str, list | None] = {k.slug: None for k in plan.katas}   # by the last check
        self.charged: dict[str, int] = {k.slug: 0 for k in plan.katas}   # the hints served for failing work
        self.withheld_said = False   # that a check withholds the fixes: said once, at the first it withholds
        self.coding: dict[str, dict] = {}
        self.answers: list[dict] = []
        self.time_up = threading.Event()
        self.started = self.coding_ended = None

    def _new_folder(self) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        folder, n = self.ws.root / "interviews" / stamp, 1
        while folder.exists():
            folder, n = self.ws.root / "interviews" / f"{stamp}-{n}", n + 1
        return folder

    def file(self, kata: Kata) -> Path:
        return self.folder / kata.learner_file

    def left_s(self) -> float:
        return self.limit_s - (time.monotonic() - self.started)

    # --- the interview -------------------------------------------------------------------------

    def run(self) -> dict:
        """Run it to the end and return the scorecard (saved to the history, abandoned or not)."""
        plan = self.plan
        self.folder.mkdir(parents=True)
        click.secho(f"Mock interview: {', '.join(k.slug for k in plan.katas)} in {_clock(self.limit_s)}, "
                    f"then {len(plan.questions)} follow-up questions.", bold=True)
        click.echo(f"Seed {plan.seed}: `{plan.replay}` replays the same interview. "
                   f"Each hint for failing work costs {HINT_COST} of the {CODING_POINTS} coding points.")
        self.started = time.monotonic()
        timer = threading.Timer(self.limit_s, self._ring)
        timer.daemon = True
        timer.start()
        status = "completed"
        try:
            try:
                for kata in plan.katas:
                    if self.time_up.is_set():
                        break
                    self._code(kata)
            finally:
                timer.cancel()
                self.coding_ended = time.monotonic()
            for kata in plan.katas:
                if kata.slug not in self.coding:
                    self._final(kata)
            click.echo()
            for number, asked in enumerate(plan.questions, 1):
                self._ask(number, asked)
        except (Abandoned, KeyboardInterrupt):
            status = "abandoned"
            click.secho("\nInterview abandoned: what you did so far is saved to the history.", fg="yellow")
        except RunnerError:   # the kit cannot grade here: keep what was done, then say why
            self.ws.history.append(self.scorecard("abandoned"))
            raise
        card = self.scorecard(status)
        self.ws.history.append(card)
        return card

    def _ring(self):
        """At the deadline: copy the files aside, as they are now, for grading."""
        aside = self.folder / "at-time-up"
        aside.mkdir(exist_ok=True)
        for kata in self.plan.katas:
            if self.file(kata).exists():
                shutil.copy2(self.file(kata), aside / kata.learner_file)
        self.time_up.set()
        click.secho("\nTime is up. Your files as they are now will be graded; press Enter.", fg="yellow", bold=True)

    def _prompt(self, text: str) -> str:
        try:
            return click.prompt(text, default="", show_default=False)
        except click.Abort:
            raise Abandoned() from None

    def _code(self, kata: Kata):
        target = self.file(kata)
        shutil.copyfile(kata.stub_path, target)
        click.echo()
        click.echo(kata.readme_path.read_text(encoding="utf-8"))
        click.secho(f"Your file: {target}", bold=True)
        click.echo(f"Edit it in your editor. At the prompt, type (first letters work):\n"
                   + COMMAND_HELP)
        while not self.time_up.is_set():
            command = self._prompt(f"[{_clock(self.left_s())} left, {kata.slug}]").strip().lower()
            if self.time_up.is_set():
                return
            if not command:
                continue
            if "check".startswith(command):
                result = self._grade(kata, target)
                click.echo(render(result, kata, replay_with=replay(kata, self.check_seed, target), withhold_fixes=True))
                self._say_withheld(kata, result)
            elif "hint".startswith(command):
                self._hint(kata)
            elif "task".startswith(command):
                click.echo(kata.readme_path.read_text(encoding="utf-8"))
            elif "done".startswith(command):
                self._finish(kata, target)
                return
            elif "quit".startswith(command):
                raise Abandoned()
            else:
                click.echo(f"Type {COMMANDS}.")

    def _say_withheld(self, kata: Kata, result: dict):
        """Once an interview, at the first check whose report left out a fix: why it is not there."""
        if self.withheld_said or not any(c["status"] in ("failed", "error") and c.get("diagnosis") in kata.diagnoses
                                         for c in result["checks"]):
            return
        self.withheld_said = True
        click.echo(f"  The `fix` lines are withheld in an interview: the diagnosis names the mistake, the fix is yours "
                   f"to find (`hint` helps, for {HINT_COST} points).")

    def _hint(self, kata: Kata):
        failed = self.failed[kata.slug]
        choice = hints.choose(kata, self.seen[kata.slug], failed)
        if choice.index is None:
            click.echo(f"No more hints, and no points taken: {hints.none_left(kata, failed)}")
            return
        self.seen[kata.slug].add(choice.index)
        # After a check that failed nothing the hint helps no grade: it is served, not charged.
        self.charged[kata.slug] += not choice.passed
        cost = "free" if choice.passed else f"-{HINT_COST} points"
        click.secho(f"{hints.heading(kata, choice)} ({cost})", bold=True)
        click.echo(kata.hints[choice.index].text)

    def _grade(self, kata: Kata, path: Path) -> dict:
        result = grade(kata, path, seed=self.check_seed, device=self.device, hidden_seed=self.check_seed)
        self.failed[kata.slug] = hints.failed_checks(result)
        problem = self.ws.record_result(kata, result)
        if problem:
            click.secho(f"warning: {problem}", fg="yellow", err=True)
        return result

    def _finish(self, kata: Kata, path: Path):
        """Grade ``path`` as the kata's final code: the result its scorecard line comes from."""
        click.echo(f"Grading your final {path.name} ...")
        self.coding[kata.slug] = self._grade(kata, path)
        click.echo(render(self.coding[kata.slug], kata, replay_with=replay(kata, self.check_seed, path)))

    def _final(self, kata: Kata):
        """A kata the clock stopped: grade the copy taken at the deadline (the file if the coding
        part ended otherwise). A kata never reached has no file and no result: it scores 0."""
        aside = self.folder / "at-time-up" / kata.learner_file
        path = aside if self.time_up.is_set() else self.file(kata)
        if path.exists():
            self._finish(kata, path)

    def _ask(self, number: int, asked: Asked):
        q = asked.question
        click.secho(f"Follow-up {number}/{len(self.plan.questions)} ({asked.kata})", bold=True)
        click.echo(asked.text)
        if q.kind == "choice":
            letters = list("abcdef"[:len(q.options)])
            for mark, option in zip(letters, asked.choices):
                click.echo(f"  {mark}) {option}")
            given = letter(self._prompt(f"Your answer ({', '.join(letters)})"))
            while given not in letters:
                given = letter(self._prompt(f"Type one letter: {', '.join(letters)}"))
        else:
            given = self._prompt(f"Your answer{f' ({q.unit})' if q.unit else ''}").strip()
        right, verdict = asked.grade(given)
        click.secho(verdict, fg="green" if right else "red")
        click.echo()
        self.answers.append({"kata": asked.kata, "id": q.id, "kind": q.kind, "params": asked.params,
                             "question": asked.text, "given": given, "expected": asked.expected,
                             "right": right})

    # --- the result ----------------------------------------------------------------------------

    def scorecard(self, status: str) -> dict:
        coding = []
        for kata in self.plan.katas:
            # No result: the clock stopped before the kata, or the learner quit while on it.
            missing = "not-graded" if self.file(kata).exists() else "not-reached"
            result = self.coding.get(kata.slug, {"status": missing, "score": 0.0, "max_score": kata.max_score})
            coding.append({"kata": kata.slug, "status": result["status"], "score": result["score"],
                           "max_score": result["max_score"], "hints": self.charged[kata.slug]})
        fraction = sum(c["score"] / c["max_score"] for c in coding) / len(coding)
        taken = sum(self.charged.values())
        coding_points = CODING_POINTS * fraction
        penalty = min(HINT_COST * taken, coding_points)
        right = sum(a["right"] for a in self.answers)
        followup_points = FOLLOWUP_POINTS * right / len(self.plan.questions)
        ended = self.coding_ended or time.monotonic()
        return {
            "type": "interview", "status": status, "seed": self.plan.seed, "folder": str(self.folder),
            "minutes": self.plan.minutes, "time_used_s": round(min(ended - self.started, self.limit_s), 1),
            "time_up": self.time_up.is_set(), "coding": coding, "hints": taken,
            "coding_points": round(coding_points - penalty, 1), "followups": self.answers,
            "followups_asked": len(self.plan.questions), "followups_right": right,
            "followup_points": round(followup_points, 1),
            "score": round(coding_points - penalty + followup_points, 1), "max_score": CODING_POINTS + FOLLOWUP_POINTS,
        }


def render_scorecard(card: dict) -> str:
    # One label column, as wide as the longest kata slug needs.
    width = max([16] + [len(c["kata"]) + 1 for c in card["coding"]])
    lines = [click.style(f"Scorecard ({card['status']}, seed {card['seed']})", bold=True)]
    for c in card["coding"]:
        lines.append(f"  {c['kata']:<{width}} {c['status']:<12} {c['score']:g}/{c['max_score']:g} points"
                     + (f", {c['hints']} hint{'s' * (c['hints'] != 1)}" if c["hints"] else ""))
    time_note = " (time ran out)" if card["time_up"] else ""
    lines += [
        f"  {'Time':<{width}} {_clock(card['time_used_s'])} of {_clock(card['minutes'] * 60)}{time_note}",
        f"  {'Coding':<{width}} {card['coding_points']:g}/{CODING_POINTS}"
        + (f" (after {card['hints']} x -{HINT_COST} for hints)" if card["hints"] else ""),
        f"  {'Follow-ups':<{width}} {card['followups_right']} of {card['followups_asked']} right: "
        f"{card['followup_points']:g}/{FOLLOWUP_POINTS}",
        click.style(f"  {'Total':<{width}} {card['score']:g}/{card['max_score']}", bold=True),
    ]
    return "\n".join(lines)
