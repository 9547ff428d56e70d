"""A class's rules: its secret, which fixes every grading seed, and its policy for graded work.

``OUT/.kata/class.json`` is written by the first `kata grade` into OUT and kept with the class's
outputs (never in what learners get: OUT/<learner>/ holds only their results). Every seed a pair
is graded at comes from the secret, the learner and the kata, so the same file gets the same
grade on every run, with --force, on another machine given a copy of OUT, and in Gradescope's
re-runs (its zip carries the class file). Grading seeds lie in [2**31, 2**32), release seeds in
[0, 2**31): a student bundle's recorded seed is never a grading seed.

The policy (flags of `kata grade`, kept in the same file) says how strict graded work is: a banned
API fails the kata, ``Fix:`` lines are withheld from learners, hidden checks are shown to learners
only as "hidden check i of n" (and after the due date on Gradescope). The deadline (``--due`` and
``--late-penalty``, kept there too) says when work is late and what that costs.
"""
from __future__ import annotations

import datetime
import functools
import hashlib
import hmac
import json
import math
import os
import re
import secrets
import tempfile
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from ..engine.structure import TAMPERING

CLASS_FILE = Path(".kata") / "class.json"
FORMAT = 1
RELEASE_SEEDS = 2**31      # release seeds: [0, 2**31)
GRADING_SEEDS = 2**31      # grading seeds: [2**31, 2**32)
BANNED = "banned-api"


class ClassFileError(Exception):
    """OUT's class file is unreadable or malformed (the message says how to fix it)."""


@dataclass(frozen=True)
class Policy:
    banned_fails: bool = False       # a kata that uses a banned API scores 0
    withhold_fixes: bool = False     # feedback names the bug, never the code that fixes it
    hide_hidden: bool = False        # hidden checks: "hidden check i of n", after the due date
    show_hidden_diagnoses: bool = False   # a failed hidden check names its diagnosis (never its inputs)

    def apply(self, result: dict) -> dict:
        """The result as this policy grades it: under ``banned_fails`` a kata that used a banned API
        scores 0, as does one whose file hides from its banned-API check what it calls (that check
        found ``tampering``: a banned call run from a string would be hidden so). Each check keeps
        its own verdict, so the feedback still says what was right."""
        hidden = any(c["id"] == BANNED and c.get("diagnosis") == TAMPERING for c in result.get("checks", ()))
        if not (self.banned_fails and (BANNED in result.get("diagnoses", ()) or hidden)):
            return result
        checks = [{**c, "score": 0.0} for c in result["checks"]]
        return {**result, "checks": checks, "score": 0.0, "status": "failed", "banned": True}


SELF_STUDY = Policy()   # what a learner's own `kata check` does; a class's default
PENALTY = re.compile(r"(none|zero|(\d+(?:\.\d+)?)%/day)")


@dataclass(frozen=True)
class Deadline:
    """A class's due date (ISO 8601, with its offset) and late policy: ``none`` (lateness is only
    said), ``zero`` (late work scores 0) or ``N%/day`` (N percent of the total for each day or part
    of a day late, to at most the total)."""
    due: str
    penalty: str = "none"

    @classmethod
    def parse(cls, due: str, penalty: str) -> Deadline:
        """Raises ValueError with the sentence to show for a date or a policy that is not one."""
        try:
            when = datetime.datetime.fromisoformat(due)
        except ValueError:
            raise ValueError(f"the due date {due!r} is not an ISO 8601 date and time "
                             "(2026-12-01T23:59+01:00).") from None
        if when.tzinfo is None:
            raise ValueError(f"the due date {due!r} names no time zone: add one (2026-12-01T23:59+01:00, or Z "
                             "for UTC), so that it means the same on every grading machine.")
        if not PENALTY.fullmatch(penalty):
            raise ValueError(f"the late policy {penalty!r} is none of none, zero or N%/day (10%/day).")
        return cls(when.isoformat(), penalty)

    def penalty_for(self, submitted: datetime.datetime, total: float) -> tuple[float, float]:
        """(days late, rounded up; the points the late policy takes from ``total``)."""
        late = (submitted - datetime.datetime.fromisoformat(self.due)).total_seconds()
        days = math.ceil(late / 86400) if late > 0 else 0
        if not days or self.penalty == "none":
            return days, 0.0
        if self.penalty == "zero":
            return days, total
        share = float(PENALTY.fullmatch(self.penalty).group(2)) / 100 * days
        return days, round(min(total, total * share), 6)


@dataclass(frozen=True)
class ClassRules:
    secret: str
    policy: Policy
    katas: tuple[str, ...] = ()   # the class's katas (slugs), the last `--katas` given; () every kata
    deadline: Deadline | None = None

    def seeds(self, learner: str, slug: str) -> tuple[int, int]:
        """(public seed, hidden seed) of one learner's kata: the same on every run of this class."""
        return tuple(GRADING_SEEDS + _draw(self.secret, part, learner, slug) for part in ("public", "hidden"))

    def with_policy(self, **given) -> ClassRules:
        """These rules with the policy flags given (None: the rule stays as it is)."""
        return replace(self, policy=replace(self.policy, **{k: v for k, v in given.items() if v is not None}))

    def with_katas(self, slugs) -> ClassRules:
        return replace(self, katas=tuple(slugs))

    def with_deadline(self, due: str | None, penalty: str | None) -> ClassRules:
        """These rules with the due date and late policy given (None: as before; a policy alone
        needs a due date given before). Raises ValueError with the sentence to show."""
        if due is None and penalty is None:
            return self
        if due is None and self.deadline is None:
            raise ValueError("a late policy needs a due date: give --due too.")
        return replace(self, deadline=Deadline.parse(due or self.deadline.due,
                                                     penalty or (self.deadline.penalty if self.deadline else "none")))

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "secret": self.secret, "policy": asdict(self.policy),
                           "katas": list(self.katas), **({"deadline": asdict(self.deadline)} if self.deadline else {})},
                          indent=1) + "\n"


def new() -> ClassRules:
    """A new class: a new secret, and the self-study policy until flags say otherwise."""
    return ClassRules(secrets.token_hex(32), SELF_STUDY)


def _draw(secret: str, *parts: str) -> int:
    digest = hmac.new(bytes.fromhex(secret), "\0".join(parts).encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") % GRADING_SEEDS


def load(out: Path) -> ClassRules | None:
    """OUT's rules, or None where no class was graded into OUT yet."""
    path = Path(out) / CLASS_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ClassFileError(f"{path} cannot be read ({exc}); restore it from a copy of OUT: it holds the "
                             "class's secret, without which grades cannot be reproduced.") from None
    names = {f.name for f in fields(Policy)}
    try:
        secret, policy, katas = data["secret"], data.get("policy", {}), data.get("katas", [])
        deadline = Deadline.parse(data["deadline"]["due"], data["deadline"]["penalty"]) if "deadline" in data else None
        bytes.fromhex(secret)
        if (data.get("format") != FORMAT or not set(policy) <= names or not all(type(v) is bool for v in policy.values())
                or not (type(katas) is list and all(type(k) is str for k in katas))):
            raise ValueError
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ClassFileError(f"{path} is not a class file of this kit (format {FORMAT}: a hex \"secret\", a "
                             f"\"policy\" of {', '.join(sorted(names))}, a list of \"katas\" and maybe a "
                             "\"deadline\"); restore it from a copy of OUT.") from None
    return ClassRules(secret, Policy(**policy), tuple(katas), deadline)


def load_or_create(out: Path, **policy) -> ClassRules:
    """OUT's rules with the policy flags given (None: as before), written back; a new class gets
    a new secret."""
    rules = load_or_new(out, **policy)
    save(out, rules)
    return rules


def load_or_new(out: Path, **policy) -> ClassRules:
    """``load_or_create`` without the writing: for a run that may yet find nothing to grade."""
    return (load(out) or new()).with_policy(**policy)


def save(out: Path, rules: ClassRules):
    """Write the class file, the instructor's own (mode 0600 from the start): it decides every
    hidden input."""
    atomic_write(Path(out) / CLASS_FILE, rules.to_json(), mode=0o600)


@functools.cache
def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, text: str, mode: int | None = None):
    """Write ``text`` so that readers see the old file or the new one, never half of it. The file
    gets ``mode``, by default what the umask gives a new file (a course's group, its TAs, reads
    the class's files as it reads the instructor's others)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    os.fchmod(fd, 0o666 & ~_umask() if mode is None else mode)
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)

