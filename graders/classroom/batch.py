"""Batch grading for instructors: every (learner, kata) pair of a class, in parallel, resumable.

``SUBMISSIONS/<learner>/<learner file>`` is graded pair by pair, each in its own sandbox, by a
pool of trusted grading processes. Each finished pair is written at once to
``OUT/.kata/records/<learner>/<slug>.json`` (the full result, for the instructor), so an
interruption or a crash loses nothing and a second run skips pairs whose submission and kit are
unchanged. The class files (grades.csv, per-learner results.json and feedback.md, summary.md) are
then rebuilt from the records; only they are meant for learners.
"""
from __future__ import annotations

import atexit
import concurrent.futures as futures
import csv
import datetime
import hashlib
import io
import itertools
import json
import multiprocessing
import os
import re
import signal
import stat
import unicodedata
from collections import Counter
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from ..engine.manifest import ROOT, TORCH_FRAMEWORKS, Kata
from ..engine.plugin import check_entry, check_names, cuda_checks, grader_files
from ..engine.report import graded_cells
from ..engine.untrusted import MAX_SUBMISSION_BYTES, TooLarge, read_capped, too_large
from ..engine.worker import landlock_abi
from ..practice import plots
from ..practice.notebook import MAX_NOTEBOOK_BYTES, grade_notebook, solution_source
from . import rules as rules_module
from .rules import SELF_STUDY, ClassRules, Policy, atomic_write

RECORDS = Path(".kata") / "records"
HIDDEN_OUTPUT = "Hidden check failed."
NOT_LOADED = "Not run: the file could not be graded (see this kata's first check)."
OUTPUT_CAP = 4000   # characters of one check's text in results.json and feedback.md


@dataclass(frozen=True)
class Pair:
    """A learner's file for a kata: ``file`` is the one found (see ``find_submission``), or where
    the expected one would be; ``why`` says why another name was graded, ``error`` why none was."""
    learner: str
    kata: Kata
    file: Path
    why: str | None = None
    error: str | None = None

    @property
    def label(self) -> str:
        return f"{self.learner}/{self.kata.slug}"


# OUT/<learner>/ must not land on these
CLASS_FILES = ("grades.csv", "checks.csv", "summary.md", "summary.png", "similarity.md", "overrides.csv")
NO_SANDBOX = ("WARNING: graded with --no-sandbox: learner code ran without a sandbox, in a separate process only "
              "(as root where no other user could read Python's installation), so it could read the kit, other "
              "learners' files and OUT. These grades are not protected against cheating.")
CONTAINER = ("Sandbox: container (--container): bubblewrap could not make namespaces in this grading container, "
             "so learner code ran as an unprivileged user of the container, who can read neither the kit nor "
             "the class's files, one user per grading process.")
LANDLOCK = {True: " Through Landlock it read only what a bubblewrap sandbox shows (Python, its libraries, NumPy and "
                  "torch): no copy of the kit anywhere else either.",
            False: " WARNING: this container's kernel (or its seccomp profile) offers no Landlock, so that user could "
                   "read any file readable by all: keep no copy of the kit (a clone of its repository) readable "
                   "by all in it."}


def printable(name: str) -> str:
    """A file name from a learner, as plain text: bytes that are not UTF-8 and characters that do
    not print (a newline, an escape sequence) written as escapes."""
    shown = os.fsencode(name).decode("utf-8", "backslashreplace")
    return shown if shown.isprintable() else shown.encode("unicode_escape").decode("ascii")


def learner_folders(submissions: Path) -> tuple[list[str], dict[str, str]]:
    """The learners of SUBMISSIONS, and the folders refused as learners (a printable name -> why).
    A folder is a learner when it is a real folder (not a link, which could point at the kit)
    whose name can name files in OUT and lines of grades.csv and summary.md."""
    names, refused = [], {}
    for path in sorted(submissions.iterdir(), key=lambda p: os.fsencode(p.name)):
        name = path.name
        if name.startswith(".") or not (path.is_dir() or path.is_symlink()):
            continue
        shown = printable(name)
        if path.is_symlink():
            refused[shown] = "it is a symbolic link, not a folder"
        elif shown != name:
            refused[shown] = "its name is not printable UTF-8 text"
        elif name in CLASS_FILES:
            refused[name] = f"its name is that of OUT/{name}, a file of the class's grades"
        else:
            names.append(name)
    return names, refused


BROWSER_COPY = re.compile(r" *\(\d+\)$")   # "softmax (1).py": a second download of the same file


def _spelled(stem: str) -> str:
    """A file name's stem as a kata's module is spelled: case, "-" for "_" and a browser's " (1)"
    aside (`Causal-Mask (1)` is `causal_mask`)."""
    return re.sub(r"[- ]+", "_", BROWSER_COPY.sub("", stem)).lower()


def _entries(folder: Path) -> list[Path]:
    """What a learner's folder holds, in order, but for what tools leave there (.ipynb_checkpoints,
    __pycache__, __MACOSX); nothing for a folder that cannot be read."""
    try:
        return sorted(p for p in folder.iterdir() if not p.name.startswith((".", "__")))
    except OSError:
        return []


def find_submission(folder: Path, kata: Kata) -> Pair:
    """``kata``'s file in a learner's ``folder``: the expected name (``kata.learner_file``, else
    the kata's notebook, ``<module>.ipynb``), else the one file spelled like it (``_spelled``), a
    .py or a notebook, at the top or one folder down (what zipping a folder gives). Two such files
    are an error that names both."""
    expected = folder / kata.learner_file
    # The kit's notebook of the kata (`kata notebook`'s, an nbgrader course's) is expected too.
    for named in (expected, folder / f"{kata.module}.ipynb"):
        if named.is_file() or named.is_symlink():
            return Pair(folder.name, kata, named)

    top = _entries(folder)
    inner = [q for d in top if d.is_dir() and not d.is_symlink() for q in _entries(d)]
    like = [p for p in top + inner
            if p.suffix in (".py", ".ipynb") and not p.is_dir() and _spelled(p.stem) == kata.module]
    shown = [f"`{printable(str(p.relative_to(folder)))}`" for p in like]
    if len(like) > 1:
        return Pair(folder.name, kata, expected, error=(
            f"{', '.join(shown[:-1])} and {shown[-1]} could each be your {kata.learner_file}, so none was "
            f"graded: submit one of them, named {kata.learner_file}."))
    if like:
        return Pair(folder.name, kata, like[0], why=(
            f"No {kata.learner_file} was submitted, so {shown[0]}, the one file named like it, was graded."))
    return Pair(folder.name, kata, expected)


def _skeleton(name: str) -> str:
    """What ``name`` looks like, after Unicode's UTS #39 skeleton: NFKC (which also makes NFC and
    NFD forms one), then each character that Unicode's confusables list maps to a prototype
    replaced by it (Cyrillic а by Latin a, I by l). confusable_homoglyphs keeps that list as each
    character's look-alikes, a prototype listing all its variants: a character with exactly one
    look-alike is that prototype's variant."""
    from confusable_homoglyphs.confusables import confusables_data

    text = unicodedata.normalize("NFKC", name)
    return "".join(alike[0]["c"] if len(alike := confusables_data.get(c, ())) == 1 else c for c in text)


def lookalike_names(names) -> list[list[str]]:
    """The groups of two or more ``names`` that look the same (see ``_skeleton``)."""
    groups = {}
    for name in names:
        groups.setdefault(_skeleton(name), []).append(name)
    return [group for group in groups.values() if len(group) > 1]


def _digest(paths) -> str:
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def kit_fingerprint(kata: Kata) -> str:
    """Changes whenever anything that decides this kata's grade changes: its manifest, grader,
    reference and oracles, or the engine. A run re-grades pairs graded by another kit."""
    files = [*(kata.files[role] for role in ("manifest", "grader", "hidden", "reference", "bugs", "expected")),
             *(ROOT / "graders" / "engine").glob("*.py")]
    return _digest(p for p in files if p.is_file())


def size_limit(file: Path) -> int:
    """The most bytes a learner's file may hold: a notebook keeps its outputs beside the code."""
    return MAX_NOTEBOOK_BYTES if file.suffix == ".ipynb" else MAX_SUBMISSION_BYTES


def holds_no_code(file: Path) -> bool:
    """Whether a learner's file holds no code: nothing, or blank lines and comments only (a
    notebook: in the cells graded). A file that cannot be read is not judged here."""
    try:
        text = (solution_source(file) if file.suffix == ".ipynb"
                else read_capped(file, MAX_SUBMISSION_BYTES).decode("utf-8", "replace"))
    except (OSError, ValueError, TooLarge):
        return False
    return all(not line.strip() or line.lstrip().startswith("#") for line in text.splitlines())


def submission_fingerprint(file: Path) -> str:
    """The file's sha256; a file too large to grade is not read (it is refused unread)."""
    if not file.is_file():
        return "missing"
    try:
        return hashlib.sha256(read_capped(file, size_limit(file))).hexdigest()
    except TooLarge:
        return f"larger than {size_limit(file)} bytes"


def linked_out(file: Path, folder: Path) -> str | None:
    """A sentence if ``file`` leads out of ``folder``, a learner's own, through a symbolic link
    (of the file or of a folder on its way), else None: it could point at the reference, a
    course's source notebooks or a classmate's file."""
    if file.resolve().is_relative_to(folder.resolve()):
        return None
    return f"{file.name} is a link to a file outside your submission, so it was not graded."


# --- when work was handed in ----------------------------------------------------------------------

SUBMITTED = "submitted.csv"   # in OUT, optional: learner,submitted (ISO 8601), as a course's LMS exports them
TIMESTAMP = "timestamp.txt"   # what nbgrader submit writes beside a submission


@dataclass(frozen=True)
class Submitted:
    when: datetime.datetime
    source: str   # where the time was read: "submitted.csv", "timestamp.txt" or "file time"


def _when(text: str) -> datetime.datetime | None:
    """An ISO 8601 time (nbgrader's "2026-11-29 10:00:00.123456 UTC" too), as UTC; None for another text."""
    text = text.strip().removesuffix(" UTC")
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    return when.replace(tzinfo=when.tzinfo or datetime.timezone.utc).astimezone(datetime.timezone.utc)


def read_submitted(path: Path, learners: list[str]) -> dict[str, datetime.datetime]:
    """learner -> when, from OUT/submitted.csv (columns learner, submitted); raises OverridesError
    naming the line that cannot be read."""
    if not path.exists():
        return {}
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise OverridesError(f"{path} cannot be read: {exc}.") from None
    if not rows or [c.strip() for c in rows[0]] != ["learner", "submitted"]:
        raise OverridesError(f"{path}: its first line must be learner,submitted.")
    folders = {unicodedata.normalize("NFC", name): name for name in learners}
    found = {}
    for line, row in enumerate(rows[1:], 2):
        if not any(cell.strip() for cell in row):
            continue
        learner, when = (row + ["", ""])[:2]
        name, time = folders.get(unicodedata.normalize("NFC", learner.strip())), _when(when)
        if name is None or time is None:
            raise OverridesError(f"{path}, line {line}: " + (f"no learner folder {learner.strip()!r}" if name is None
                                 else f"{when.strip()!r} is not an ISO 8601 time (2026-12-01T23:59+01:00)") + ".")
        found[name] = time
    return found


def submission_file(folder: Path, name: str) -> str | None:
    """``name`` in a learner's folder (what nbgrader submit writes there: timestamp.txt ...), when it
    is a small regular file (never a link) of UTF-8 text."""
    path = folder / name
    try:
        found = path.lstat()
        if not stat.S_ISREG(found.st_mode) or found.st_size > 1024:
            return None
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def submitted_at(folder: Path, files: list[Path], listed: datetime.datetime | None) -> Submitted | None:
    """When a learner handed work in: the course's own record (OUT/submitted.csv), else the
    timestamp.txt nbgrader's submit wrote in their folder, else the newest time of their files
    graded (a time a learner's zip can set: the instructor's to judge, as grades.csv names it)."""
    if listed is not None:
        return Submitted(listed, SUBMITTED)
    when = _when(submission_file(folder, TIMESTAMP) or "")
    if when is not None:
        return Submitted(when, TIMESTAMP)
    times = [f.lstat().st_mtime for f in files if f.is_file()]
    return Submitted(datetime.datetime.fromtimestamp(max(times), datetime.timezone.utc), "file time") if times else None


@dataclass(frozen=True)
class Late:
    """A learner's work against the class's deadline: when it came, how many days late (rounded
    up) and the points the late policy takes from their total."""
    deadline: rules_module.Deadline
    submitted: Submitted | None
    days: int
    penalty: float

    @property
    def sentence(self) -> str:
        if self.submitted is None:
            return "No time of submission could be read, so no late penalty applies."
        when = f"Submitted {self.submitted.when:%Y-%m-%d %H:%M} UTC ({self.submitted.source})"
        if not self.days:
            return f"{when}, by the due date ({self.deadline.due})."
        return (f"{when}, {self.days} day(s) after the due date ({self.deadline.due}): the late policy "
                f"({self.deadline.penalty}) takes {_num(self.penalty)} point(s).")


# --- the instructor's overrides -------------------------------------------------------------------

OVERRIDES = "overrides.csv"   # in OUT: the instructor's, read by every run
OVERRIDE_COLUMNS = ["learner", "kata", "score", "reason"]


class OverridesError(ValueError):
    """OUT/overrides.csv cannot be applied; the message names the line and what is wrong."""


@dataclass(frozen=True)
class Override:
    score: float
    reason: str


def read_overrides(path: Path, katas: list[Kata], learners: list[str]) -> dict[tuple[str, str], Override]:
    """(learner, slug) -> the score the instructor gives instead of the graded one, and why, from
    ``path`` (columns learner, kata, score, reason; none where it does not exist)."""
    if not path.exists():
        return {}
    by_slug = {k.slug: k for k in katas}
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise OverridesError(f"{path} cannot be read: {exc}.") from None
    if not rows or [c.strip() for c in rows[0]] != OVERRIDE_COLUMNS:
        raise OverridesError(f"{path}: its first line must be {','.join(OVERRIDE_COLUMNS)}.")
    # A name typed in a spreadsheet may be composed (NFC) where the folder's is decomposed (NFD,
    # as macOS writes it), or the other way round: both name the same folder.
    folders = {}
    for folder in learners:
        folders.setdefault(unicodedata.normalize("NFC", folder), []).append(folder)
    found = {}
    for line, row in enumerate(rows[1:], 2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) > 4:
            raise OverridesError(f"{path}, line {line}: it has {len(row)} cells, not 4 (quote a reason that "
                                 "holds a comma).")
        learner, slug, score, reason = (cell.strip() for cell in row + [""] * (4 - len(row)))
        named = folders.get(unicodedata.normalize("NFC", learner), [])
        kata = by_slug.get(slug)
        try:
            points = float(score)
        except ValueError:
            points = None
        learner = named[0] if len(named) == 1 else learner
        why = (f"no learner folder {learner!r}" if not named else
               f"{learner!r} names two learner folders, {' and '.join(map(ascii, named))}, the same name in two "
               "Unicode forms: rename one of them" if len(named) > 1 else
               f"{slug!r} is not one of this class's katas ({', '.join(by_slug)})" if kata is None else
               f"the score {score!r} is not a number from 0 to {kata.max_score:g}"
               if points is None or not 0 <= points <= kata.max_score else
               "the reason is empty: say why, the learner reads it" if not reason else
               f"{learner}'s {kata.slug} is overridden on an earlier line too" if (learner, kata.slug) in found
               else None)
        if why:
            raise OverridesError(f"{path}, line {line}: {why}.")
        found[learner, kata.slug] = Override(points, reason)
    return found


def overridden(result: dict, override: Override | None) -> dict:
    """The result with the instructor's score in place of the graded one, marked as such."""
    if override is None:
        return result
    return {**result, "score": override.score,
            "override": {"score": override.score, "graded": result["score"], "reason": override.reason}}


# --- results for pairs the runner did not grade ---------------------------------------------------

KIT_BUG = "same file, kit and seeds: please report this as a bug of the kit"
NOT_DETERMINISTIC = ("same file, kit and seeds, and a second replay differs from this one too: the file itself is "
                     "not deterministic (it draws from the system's randomness, the clock or threads), so each "
                     "grading of it may differ")


def _graded(result: dict) -> dict:
    """What a replay must reproduce: the result without how long it took or where the file was."""
    timing = ("duration_s", "file")
    return {**{k: v for k, v in result.items() if k not in timing},
            "checks": [{k: v for k, v in c.items() if k not in timing} for c in result["checks"]]}


def graded_on(kata: Kata, device: str) -> str:
    """The device a run of ``kata`` gets when asked for ``device``, told as the pool's zygotes
    tell it (no `import torch` here)."""
    return "cuda" if kata.framework != "numpy" and device != "cpu" and Path("/dev/nvidiactl").exists() else "cpu"


def unrun_result(kata: Kata, file: Path, status: str, message: str, device: str = "cpu") -> dict:
    """A complete result in which every check failed for one reason (no file, an empty one, a kit failure).
    A check that needs CUDA is skipped off ``device`` "cuda", as in a graded run: it counts in
    neither the score nor the maximum."""
    names = {cid: name for path in grader_files(kata) for cid, name in check_names(path).items()}
    cuda_only = cuda_checks(kata) if device != "cuda" else set()
    checks = [check_entry(cid, names.get(cid) or cid, points=points,
                          **({"status": "skipped", "message": "needs a CUDA device"} if cid in cuda_only else
                             {"status": "failed" if status in ("missing", "empty") else "error", "message": message}))
              for cid, points in kata.checks.items()]
    return {"kata": kata.slug, "file": str(file), "status": status, "score": 0.0,
            "max_score": round(sum(c["max_score"] for c in checks), 6), "seed": None, "device": device, "duration_s": 0.0,
            "checks": checks, "diagnoses": []}


# --- the pool of trusted grading processes --------------------------------------------------------

# Each grading process forks its sandboxes from warm zygotes, one per framework: the same
# zygote `kata check` would start, so nothing in the sandbox tells a graded run from a check.
_zygotes = {}


def _init_process(rank_groups=None):
    # Ctrl-C reaches the whole foreground group: the parent decides, and lets running pairs finish.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if rank_groups is not None:   # a grading container: one rank group at a time (see sandbox._OneGrading)
        from ..engine.sandbox import one_rank_group_at_a_time

        one_rank_group_at_a_time(rank_groups)
    atexit.register(lambda: [zygote.close() for zygote in _zygotes.values()])
    # One thread each, one process per core already; read by torch when a torch kata's grader first
    # imports it (a class of NumPy katas never pays for an `import torch` here).
    os.environ["OMP_NUM_THREADS"] = "1"


def _grade_in_process(slug: str, file: str, seeds: tuple[int, int], device: str, sandbox: str) -> dict:
    from ..engine import manifest
    from ..engine.runner import RunnerError, grade
    from ..engine.sandbox import Zygote

    kata = manifest.find(slug)
    if kata.framework not in _zygotes:
        cuda = kata.framework in TORCH_FRAMEWORKS and graded_on(kata, device) == "cuda"
        _zygotes[kata.framework] = Zygote([kata.framework], isolated=sandbox == "bwrap",
                                          container=sandbox == "container", cuda=cuda, warm=True)
    grade_file = grade_notebook if file.endswith(".ipynb") else grade
    try:
        return grade_file(kata, Path(file), seed=seeds[0], hidden_seed=seeds[1], device=device,
                          zygote=_zygotes[kata.framework])
    except ValueError as exc:   # a notebook that is not one, or has no solution cell
        return unrun_result(kata, Path(file), "error", str(exc), graded_on(kata, device))
    except RunnerError as exc:
        return unrun_result(kata, Path(file), "error", f"The kit could not grade this file: {exc}",
                            graded_on(kata, device))


# --- the run --------------------------------------------------------------------------------------

class Grading:
    def __init__(self, submissions: Path, out: Path, katas: list[Kata], *, jobs: int, force: bool,
                 rules: ClassRules, device: str, sandbox: str = "bwrap",
                 refused: dict | None = None, refused_folders: dict | None = None, only: list[str] | None = None):
        """``rules``: the class's secret and policy (``rules.load_or_create``). ``sandbox``: grade
        under bwrap ("bwrap"), as an unprivileged user of a grading container ("container": kata
        grade --container) or in a process only ("process": --no-sandbox). ``refused``: (learner,
        slug) -> a sentence, for files refused before grading (a notebook that could not be read,
        say). ``refused_folders``: folder -> why, for folders refused as learners before SUBMISSIONS
        was made (an nbgrader course's submitted/). ``only``: grade these learners alone (the class
        files still cover everyone graded into OUT)."""
        self.submissions, self.out, self.katas = Path(submissions), Path(out), katas
        self.jobs, self.force, self.device = max(1, jobs), force, device
        self.rules = rules
        self.sandbox = sandbox
        self.learners, found = learner_folders(self.submissions)
        self.refused_folders = {**(refused_folders or {}), **found}
        self.refused = refused or {}
        self.kit = {k.slug: kit_fingerprint(k) for k in katas}
        self.overrides = read_overrides(self.out / OVERRIDES, katas, self.learners)
        self.listed_times = read_submitted(self.out / SUBMITTED, self.learners)
        self.pairs = [find_submission(self.submissions / name, kata)
                      for name in self.learners if only is None or name in only for kata in katas]

    def record_path(self, learner: str, slug: str) -> Path:
        return self.out / RECORDS / learner / f"{slug}.json"

    def load_record(self, learner: str, slug: str) -> dict | None:
        try:
            record = json.loads(self.record_path(learner, slug).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) and isinstance(record.get("result"), dict) else None

    def is_current(self, pair: Pair) -> bool:
        record = self.load_record(pair.learner, pair.kata.slug)
        return (record is not None and not record.get("kit_error")
                and record.get("submission") == submission_fingerprint(pair.file)
                and record.get("graded_as") == pair.why
                and record.get("kit") == self.kit[pair.kata.slug]
                and record.get("seeds") == list(self.seeds(pair)))   # graded under this class's secret

    def seeds(self, pair: Pair) -> tuple[int, int]:
        return self.rules.seeds(pair.learner, pair.kata.slug)

    def save(self, pair: Pair, fingerprint: str, result: dict):
        kit_error = result["status"] == "error" and any(
            c["message"].startswith("The kit could not grade") for c in result["checks"])
        # What replays this grading exactly: the same file, kit and seeds (`kata grade --replay`).
        record = {"learner": pair.learner, "kata": pair.kata.slug, "submission": fingerprint,
                  "kit": self.kit[pair.kata.slug], "seeds": list(self.seeds(pair)), "kit_error": kit_error,
                  "graded_as": pair.why, "result": result}
        atomic_write(self.record_path(pair.learner, pair.kata.slug), json.dumps(record, indent=1))

    def todo(self) -> list[Pair]:
        return [p for p in self.pairs if self.force or not self.is_current(p)]

    def refusal(self, pair: Pair) -> tuple[str, str] | None:
        """(status, message) for a file that is not graded at all, else None."""
        name = pair.kata.learner_file
        if (pair.learner, pair.kata.slug) in self.refused:
            return "error", self.refused[pair.learner, pair.kata.slug]
        if pair.error:
            return "error", pair.error
        if not pair.file.is_file():
            return "missing", f"No {name} was submitted."
        refused = (linked_out(pair.file, self.submissions / pair.learner)
                   or too_large(pair.file, size_limit(pair.file)))
        if refused is not None:
            return "error", refused
        if holds_no_code(pair.file):
            shown = printable(str(pair.file.relative_to(self.submissions / pair.learner)))
            return "empty", f"`{shown}` is empty: it holds no code, so nothing was graded."
        return None

    def run(self, pairs: list[Pair], progress=lambda pair, result: None, *, keep: bool = True):
        """Grade ``pairs``, saving each as it finishes (``keep``; a replay does not). A grading
        process that dies takes its pairs with it: they are tried once more in a fresh pool, then
        recorded as kit errors."""
        def finished(pair, fingerprint, result):
            if keep:
                self.save(pair, fingerprint, result)
            progress(pair, result)

        graded = []
        for pair in pairs:
            refused = self.refusal(pair)
            if refused is None:
                graded.append(pair)
                continue
            finished(pair, submission_fingerprint(pair.file),
                     unrun_result(pair.kata, pair.file, *refused, graded_on(pair.kata, self.device)))
        attempts = Counter()   # by label: a Pair holds its Kata, which is not hashable
        while graded:
            broken = self._run_pool(graded, finished)
            attempts.update(p.label for p in broken)
            graded = [p for p in broken if attempts[p.label] < 2]
            for pair in broken:
                if attempts[pair.label] >= 2:
                    result = unrun_result(pair.kata, pair.file, "error", "The kit could not grade this file: "
                                          "its grading process died twice (see the instructor's log).",
                                          graded_on(pair.kata, self.device))
                    finished(pair, submission_fingerprint(pair.file), result)

    def replay(self) -> list[tuple[Pair, dict, bool | str]]:
        """Grade this run's pairs again at the class's seeds, saving nothing: (pair, the result
        now, True if it is the recorded one, else a sentence saying what differs) for each."""
        now = {}
        self.run(self.pairs, lambda pair, result: now.__setitem__(pair.label, result), keep=False)
        verdicts = {p.label: self._same_as_recorded(p, now[p.label]) for p in self.pairs}
        # Differing with the same file, kit and seeds: a third grading tells a file that is itself
        # not deterministic (its own differs from this replay too) from a bug of the kit.
        unexplained = [p for p in self.pairs if verdicts[p.label] is not True and KIT_BUG in verdicts[p.label]]
        again = {}
        if unexplained:
            self.run(unexplained, lambda pair, result: again.__setitem__(pair.label, result), keep=False)
        for pair in unexplained:
            if _graded(again[pair.label]) != _graded(now[pair.label]):
                verdicts[pair.label] = verdicts[pair.label].replace(KIT_BUG, NOT_DETERMINISTIC)
        return [(p, now[p.label], verdicts[p.label]) for p in self.pairs]

    def _same_as_recorded(self, pair: Pair, now: dict) -> bool | str:
        record = self.load_record(pair.learner, pair.kata.slug)
        if record is None:
            return "never graded into OUT, so there is nothing to compare with."
        before = record["result"]
        if _graded(before) == _graded(now):
            return True
        why = ("the file changed since" if record.get("submission") != submission_fingerprint(pair.file) else
               "the kit changed since" if record.get("kit") != self.kit[pair.kata.slug] else
               "the class secret changed since" if record.get("seeds") != list(self.seeds(pair)) else
               KIT_BUG)
        return f"DIFFERENT from the recorded {before['score']:g}/{before['max_score']:g} ({before['status']}): {why}."

    def _run_pool(self, pairs: list[Pair], finished) -> list[Pair]:
        context = multiprocessing.get_context("spawn")
        broken = []
        rank_groups = context.Lock() if self.sandbox == "container" else None
        with futures.ProcessPoolExecutor(min(self.jobs, len(pairs)), mp_context=context,
                                         initializer=_init_process, initargs=(rank_groups,)) as pool:
            # The fingerprint is taken before grading: a file changed meanwhile is graded again.
            running = {pool.submit(_grade_in_process, p.kata.slug, str(p.file), self.seeds(p), self.device,
                                   self.sandbox):
                       (p, submission_fingerprint(p.file)) for p in pairs}
            seen = set()   # the futures whose pairs were saved (or found broken) already
            try:
                for future in futures.as_completed(running):
                    pair, fingerprint = running[future]
                    try:
                        result = future.result()
                    except futures.process.BrokenProcessPool:
                        broken.append(pair)
                    else:
                        finished(pair, fingerprint, result)
                    seen.add(future)
            except KeyboardInterrupt:
                pool.shutdown(wait=True, cancel_futures=True)
                for future, (pair, fingerprint) in running.items():   # those that finished meanwhile, once each
                    if future not in seen and future.done() and not future.cancelled() and future.exception() is None:
                        finished(pair, fingerprint, future.result())
                raise
        return broken

    # --- the class files ------------------------------------------------------------------------

    def results(self) -> dict[str, dict[str, dict]]:
        """learner -> slug -> result as the class's policy grades it, for this run's katas, with the
        instructor's overrides (OUT/overrides.csv) applied."""
        return {name: {k.slug: self._result(name, k.slug, record) for k in self.katas
                       if (record := self.load_record(name, k.slug)) is not None}
                for name in self.learners}

    def _result(self, learner: str, slug: str, record: dict) -> dict:
        graded = {**self.rules.policy.apply(record["result"]), "graded_as": record.get("graded_as")}
        return overridden(graded, self.overrides.get((learner, slug)))

    def sources(self, results: dict) -> dict[str, dict[str, str]]:
        """learner -> slug -> the code graded (a notebook's solution cells), for each file graded."""
        found = {}
        for name, by_kata in results.items():
            for slug, result in by_kata.items():
                if result["seed"] is None:   # missing or refused: nothing of it ran
                    continue
                file = Path(result["file"])
                try:
                    code = (solution_source(file) if file.suffix == ".ipynb"
                            else read_capped(file, size_limit(file)).decode("utf-8", "replace"))
                except (OSError, ValueError):   # gone or changed since it was graded
                    continue
                found.setdefault(name, {})[slug] = code
        return found

    def lateness(self, results: dict) -> dict[str, Late]:
        """learner -> their work's lateness and penalty, under the class's deadline (none: {})."""
        deadline = self.rules.deadline
        if deadline is None:
            return {}
        found = {}
        for name, by_kata in results.items():
            files = [find_submission(self.submissions / name, kata).file for kata in self.katas]
            when = submitted_at(self.submissions / name, files, self.listed_times.get(name))
            total = sum(r["score"] for r in by_kata.values())
            found[name] = Late(deadline, when, *deadline.penalty_for(when.when, total) if when else (0, 0.0))
        return found

    def write_class_files(self):
        """grades.csv, checks.csv, summary.md and each learner's results.json and feedback.md, for
        this run's katas (a kata graded into OUT by an earlier run keeps its records only)."""
        katas = self.katas
        results = self.results()
        # A result graded without bwrap (now or in an earlier run) warns in every class file.
        modes = {r.get("sandbox") for by_kata in results.values() for r in by_kata.values()}
        unsandboxed = "process" in modes
        late = self.lateness(results)
        atomic_write(self.out / "grades.csv", grades_csv(katas, results, late))
        atomic_write(self.out / "checks.csv", checks_csv(katas, results))
        atomic_write(self.out / "similarity.md", similarity_md(katas, self.sources(results)))
        plots.save(summary_figure(katas, results), self.out / "summary.png")
        for name, by_kata in results.items():
            graded = gradescope_results(katas, by_kata, self.rules.policy, late.get(name))
            if unsandboxed:
                graded["output"] = f"{NO_SANDBOX}\n{graded['output']}"
            atomic_write(self.out / name / "results.json", json.dumps(graded, indent=1))
            atomic_write(self.out / name / "feedback.md",
                         feedback_md(name, katas, by_kata, self.rules.policy, late.get(name)))
        atomic_write(self.out / "summary.md", summary_md(katas, results, self.refused_folders,
                                                         warning=NO_SANDBOX if unsandboxed else
                                                         CONTAINER + LANDLOCK[landlock_abi() > 0]
                                                         if "container" in modes else None,
                                                         policy=self.rules.policy))


# --- renderings -----------------------------------------------------------------------------------

def _num(x: float) -> str:
    return f"{x:g}"


def _hidden(check: dict) -> bool:
    return check.get("visibility", "visible") == "hidden"


def _capped(text: str) -> str:
    return text if len(text) <= OUTPUT_CAP else text[:OUTPUT_CAP] + "\n… (cut)"


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
NUMBER = re.compile(r"[+-]?\d+(\.\d+)?([eE][+-]?\d+)?")


def _cell(text: str) -> str:
    """A grades.csv cell that no spreadsheet runs as a formula: one that starts like a formula
    (a learner named `=HYPERLINK(...)`) gets a leading quote, as OWASP's "CSV Injection" page
    advises; a plain number stays a number."""
    return f"'{text}" if text.startswith(FORMULA_START) and not NUMBER.fullmatch(text) else text


def _csv(rows) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([_cell(str(text)) for text in row] for row in rows)
    return buf.getvalue()


def _status_cell(result: dict) -> str:
    return result["status"] + (" (overridden)" if result.get("override") else "")


def grades_csv(katas: list[Kata], results: dict, late: dict | None = None) -> str:
    """A row per learner: each kata's score, the total and the most there was, then each kata's
    status (passed, failed, not-started, error, missing, or empty: a file with no code; a blank cell
    where it was never graded), which tells a 0 for a missing file from a 0 for a crash. Under a
    deadline (``late``: learner -> Late), then when the work came and from where that was read, the
    days late, the late penalty and the total after it."""
    late = late or {}
    rows = [["learner", *(k.slug for k in katas), "total", "max", *(f"{k.slug} status" for k in katas),
             *(["submitted", "submitted from", "days late", "late penalty", "total after penalty"] if late else [])]]
    for name, by_kata in sorted(results.items()):
        scores = [by_kata[k.slug]["score"] if k.slug in by_kata else 0.0 for k in katas]
        most = [by_kata[k.slug]["max_score"] if k.slug in by_kata else k.max_score for k in katas]
        total = round(sum(scores), 6)
        row = [name, *map(_num, scores), _num(total), _num(round(sum(most), 6)),
               *(_status_cell(by_kata[k.slug]) if k.slug in by_kata else "" for k in katas)]
        if name in late:
            when = late[name].submitted
            row += [when.when.isoformat(timespec="seconds") if when else "", when.source if when else "",
                    late[name].days, _num(late[name].penalty), _num(round(total - late[name].penalty, 6))]
        rows.append(row)
    return _csv(rows)


def checks_csv(katas: list[Kata], results: dict) -> str:
    """A row per learner, kata and check, hidden checks included (this file is the instructor's):
    for item analysis, which checks a class fails and with which diagnosis."""
    rows = [["learner", "kata", "check", "score", "max", "status", "diagnosis"]]
    for name, by_kata in sorted(results.items()):
        for kata in katas:
            for check in by_kata[kata.slug]["checks"] if kata.slug in by_kata else ():
                rows.append([name, kata.slug, check["id"], _num(check["score"]), _num(check["max_score"]),
                             check["status"], check.get("diagnosis") or ""])
    return _csv(rows)


def _check_text(check: dict, kata: Kata, policy: Policy) -> str:
    """What a learner may read about one check."""
    if check["status"] == "passed":
        return ""
    code = check.get("diagnosis")
    diagnosis = kata.diagnoses.get(code) if code else None
    explained = diagnosis and (f": {diagnosis.explain}" + ("" if policy.withhold_fixes else f" Fix: {diagnosis.fix}"))
    said = [f"Diagnosis: {code}" + (explained or "")] if code else []
    if _hidden(check):
        if check["status"] == "skipped":
            return "Skipped."
        return "\n".join([HIDDEN_OUTPUT, *(said if policy.show_hidden_diagnoses else [])])
    lines = [check["message"], *said]
    if check.get("output"):
        lines.append("Your code printed:\n" + check["output"])
    return _capped("\n".join(lines))


def _titles(result: dict, policy: Policy) -> dict[str, str]:
    """check id -> how learners see it named: under ``hide_hidden`` a hidden check is only
    "hidden check i of n", so its name says nothing of what it tries."""
    hidden = [c["id"] for c in result["checks"] if _hidden(c)]
    titles = {c["id"]: c["name"] for c in result["checks"]}
    if policy.hide_hidden:
        titles.update({cid: f"hidden check {i} of {len(hidden)}" for i, cid in enumerate(hidden, 1)})
    return titles


BANNED_NOTE = ("Uses a banned API, or hides what it calls from the check of them: under this class's rules the kata "
               "scores 0.")


def gradescope_results(katas: list[Kata], by_kata: dict, policy: Policy = SELF_STUDY, late: Late | None = None) -> dict:
    """One learner's grades in Gradescope's results.json format: a test per check, and one that
    takes the late penalty (``late``: under a deadline) off the total."""
    tests, lines = [], [late.sentence] if late else []
    for kata in katas:
        result = by_kata.get(kata.slug)
        if result is None:
            continue
        later = [c for c in result["checks"] if policy.hide_hidden and _hidden(c)]
        # What the hidden checks earned shows when they do: the line says the score of the checks shown.
        shown = (f"{_num(result['score'] - sum(c['score'] for c in later))}/"
                 f"{_num(result['max_score'] - sum(c['max_score'] for c in later))} from the checks shown now, "
                 f"{len(later)} hidden check(s) shown after the due date" if later and not result.get("override")
                 else f"{_num(result['score'])}/{_num(result['max_score'])}")
        lines.append(f"{kata.slug}: {shown} ({result['status']})"
                     + (f" {BANNED_NOTE}" if result.get("banned") else "")
                     + (f" {result['graded_as']}" if result.get("graded_as") else "")
                     + (f" {graded_cells(result)}" if result.get("cells") else "")
                     + (f" {_override_text(result)}" if result.get("override") else ""))
        titles = _titles(result, policy)
        for i, check in enumerate(result["checks"], 1):
            if check["status"] == "skipped" and not _hidden(check):
                continue   # a CUDA-only check on a CPU grader: worth nothing here
            # A file that could not be loaded failed every check for one reason: said once.
            output = (NOT_LOADED if result["status"] in ("error", "empty") and i > 1
                      else _check_text(check, kata, policy))
            later = policy.hide_hidden and _hidden(check)
            tests.append({"name": f"{kata.slug}: {titles[check['id']]}", "number": f"{kata.order}.{i}",
                          "score": check["score"], "max_score": check["max_score"],
                          "status": "passed" if check["status"] == "passed" else "failed",
                          "output": output, "visibility": "after_due_date" if later else "visible"})
    penalty = late.penalty if late else 0.0
    if penalty:
        tests.append({"name": "late penalty", "score": -penalty, "max_score": 0, "status": "failed",
                      "output": late.sentence, "visibility": "visible"})
    hiding = any(t["visibility"] != "visible" for t in tests) and not any(r.get("override") for r in by_kata.values())
    # A total given at the top would show what the hidden tests earned: Gradescope adds the tests' own.
    total = {} if hiding else {"score": round(sum(r["score"] for r in by_kata.values()) - penalty, 6)}
    return {**total, "execution_time": round(sum(r.get("duration_s") or 0 for r in by_kata.values()), 3),
            "output": "\n".join(lines), "visibility": "visible", "stdout_visibility": "hidden",
            "tests": tests}


def _override_text(result: dict) -> str:
    o = result["override"]
    return (f"Your instructor set this kata's score to {_num(o['score'])}/{_num(result['max_score'])} "
            f"(graded {_num(o['graded'])}): {o['reason']}")


def feedback_md(name: str, katas: list[Kata], by_kata: dict, policy: Policy = SELF_STUDY,
                late: Late | None = None) -> str:
    total = sum(r["score"] for r in by_kata.values())
    most = sum(r["max_score"] for r in by_kata.values())
    lines = [f"# Feedback for {name}", "", f"Total: **{_num(total)}/{_num(most)}** points.", "",
             *([late.sentence, ""] if late else [])]
    for kata in katas:
        result = by_kata.get(kata.slug)
        if result is None:
            continue
        lines += [f"## {kata.slug}: {kata.title}: {_num(result['score'])}/{_num(result['max_score'])} "
                  f"({result['status']})", ""]
        if result.get("graded_as"):
            lines += [result["graded_as"], ""]
        if result.get("cells"):
            lines += [graded_cells(result), ""]
        if result.get("override"):
            lines += [f"**{_override_text(result)}**", ""]
        if result["status"] == "missing":
            lines += [f"No `{kata.learner_file}` was submitted.", ""]
            continue
        if result["status"] == "empty":
            lines += [result["checks"][0]["message"], ""]
            continue
        if result["status"] == "not-started":
            lines += [f"Not started: every check still reached `NotImplementedError` in `{kata.learner_file}`.", ""]
            continue
        if result["status"] == "error":
            first = result["checks"][0]["message"] if result["checks"] else ""
            lines += ["Your file could not be graded:", "", "```", _capped(first).replace("```", "'''"), "```", ""]
            continue
        if result.get("banned"):
            lines += [f"**{BANNED_NOTE}**", ""]
        titles = _titles(result, policy)
        passed = [c for c in result["checks"] if c["status"] == "passed"]
        if passed:
            named = [titles[c["id"]] if policy.hide_hidden and _hidden(c) else f"`{c['id']}`" for c in passed]
            lines += ["Passed: " + ", ".join(named) + ".", ""]
        for check in result["checks"]:
            if check["status"] in ("passed", "skipped"):
                continue
            if _hidden(check):
                title = titles[check["id"]] if policy.hide_hidden else "a hidden check"
            else:
                title = f"`{check['id']}`: {check['name']}"
            lines += [f"### ✗ {title} ({_num(check['score'])}/{_num(check['max_score'])})", "", "```",
                      _check_text(check, kata, policy).replace("```", "'''"), "```", ""]
    return "\n".join(lines)


# How a pair stands in the class files: a status, but a failed pair with no point apart, and what
# summary.png draws for each pair handed in (a missing or empty file is counted under its kata instead).
UNGRADED = ("missing", "empty")
MARKS = {"graded": (("passed", "failed"), "o", "tab:blue"), "graded 0": (("graded 0",), "o", "tab:red"),
         "not started": (("not-started",), "x", "tab:gray"), "error": (("error",), "^", "tab:orange")}


def standing(result: dict) -> str:
    """``result``'s status, "graded 0" for a failed one that scored nothing."""
    return "graded 0" if result["status"] == "failed" and result["score"] == 0 else result["status"]


def summary_figure(katas: list[Kata], results: dict):
    """summary.png: each kata's scores across the class (a share of its full score, one mark a
    learner who handed work in: a dot graded, red at 0, a cross not started, a triangle an error;
    the box their quartiles; a missing or empty file is counted under the kata's name, never drawn
    as a 0), and the diagnoses found most often."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 5), layout="constrained")
    FigureCanvasAgg(figure)
    scores, common = figure.subplots(1, 2, width_ratios=(3, 2))
    handed = [[r for by_kata in results.values() if (r := by_kata.get(k.slug)) and r["status"] not in UNGRADED]
              for k in katas]
    columns = range(1, len(katas) + 1)
    scores.boxplot([[r["score"] / (r["max_score"] or 1.0) for r in got] for got in handed], positions=list(columns),
                   widths=0.6, showfliers=False)
    for column, got in zip(columns, handed):
        for label, (kinds, marker, colour) in MARKS.items():
            at = [(column + 0.25 * ((i * 0.618) % 1 - 0.5), r["score"] / (r["max_score"] or 1.0))   # spread, the same
                  for i, r in enumerate(got) if standing(r) in kinds]                              # every run
            if at:
                scores.plot(*zip(*at), marker, color=colour, alpha=0.6, markersize=5, label=label)
    scores.set(xticks=list(columns), ylim=(-0.05, 1.05), ylabel="score, as a share of the kata's full score",
               title=f"Scores of {len(results)} learner(s)")
    missing = [Counter(r["status"] for by_kata in results.values() if (r := by_kata.get(k.slug))
                       and r["status"] in UNGRADED) for k in katas]
    scores.set_xticklabels([k.slug + "".join(f"\n{n} {status}" for status, n in sorted(m.items()))
                            for k, m in zip(katas, missing)], rotation=30, ha="right")
    handles = {h.get_label(): h for h in scores.get_lines() if h.get_label() in MARKS}
    if handles:
        scores.legend(handles.values(), handles.keys(), loc="lower left", fontsize="small")
    found = Counter((slug, code) for by_kata in results.values() for slug, r in by_kata.items()
                    for code in r["diagnoses"]).most_common(10)
    if found:
        common.barh(range(len(found), 0, -1), [count for _, count in found], color="tab:red")
        common.set(yticks=range(len(found), 0, -1), yticklabels=[f"{code} ({slug})" for (slug, code), _ in found],
                   xlabel="learners", title="Diagnoses found most often")
    else:
        common.set_axis_off()
        common.text(0.5, 0.5, "No known bug was diagnosed.", ha="center", va="center")
    return figure


# copydetect's winnowing (as MOSS does): fingerprints of 25-token k-grams, one kept per window of 6,
# after names and literals are normalised, so renaming variables hides nothing.
NOISE_TOKENS, WINDOW = 25, 6
# The share of each file's fingerprinted code found in the other. Correct solutions written
# independently (the style zoo's, per kata) share at most a third; a copy with names changed, all.
SIMILAR = 0.7


def _fingerprint(code: str, boilerplate=None):
    from copydetect import CodeFingerprint

    return CodeFingerprint("code.py", NOISE_TOKENS, WINDOW, boilerplate=boilerplate, fp=io.StringIO(code))


def similarity_md(katas: list[Kata], sources: dict[str, dict[str, str]]) -> str:
    """For each kata, the pairs of learners whose files share most of their code beyond the
    kata's stub (the code the kit gives), most similar first."""
    import numpy as np
    from copydetect import compare_files

    lines = ["# Similar files", "",
             f"Pairs of learners whose files for a kata share at least {SIMILAR:.0%} of their code both ways, "
             "beyond the kata's stub, compared by copydetect's winnowing (as MOSS does: names and literals do "
             "not count). Correct solutions written apart share at most about a third. A listed pair is a "
             "place to look, not a verdict.", ""]
    rows = []
    for kata in katas:
        given = np.array(sorted(_fingerprint(kata.stub_path.read_text(encoding="utf-8")).hashes), dtype=np.int64)
        prints = {name: _fingerprint(by_kata[kata.slug], given) for name, by_kata in sorted(sources.items())
                  if kata.slug in by_kata}
        prints = {name: fp for name, fp in prints.items() if fp.token_coverage >= NOISE_TOKENS}   # not the stub alone
        similar = []
        for (a, pa), (b, pb) in itertools.combinations(prints.items(), 2):
            if len(pa.hashes & pb.hashes) < SIMILAR * min(len(pa.hashes), len(pb.hashes)):
                continue   # too few shared fingerprints to reach SIMILAR: no need to align them
            _, (sa, sb), _ = compare_files(pa, pb)
            if min(sa, sb) >= SIMILAR:
                similar.append((min(sa, sb), f"| {kata.slug} | `{a}` | `{b}` | {sa:.0%} | {sb:.0%} |"))
        rows += [row for _, row in sorted(similar, key=lambda pair: -pair[0])]
    if rows:
        lines += ["| kata | learner | learner | of the first's code | of the second's |", "|---|---|---|---|---|", *rows]
    else:
        lines.append("No pair of files is that similar.")
    return "\n".join(lines) + "\n"


def policy_text(policy: Policy) -> str:
    said = [what for on, what in ((policy.banned_fails, "a banned API scores the kata 0"),
                                  (policy.withhold_fixes, "feedback withholds the fixes"),
                                  (policy.hide_hidden, ("hidden checks are unnamed to learners (Gradescope: "
                                                        "shown after the due date)")),
                                  (policy.show_hidden_diagnoses, "a failed hidden check names its diagnosis"))
            if on]
    text = "; ".join(said)
    return f"{text[0].upper()}{text[1:]}." if said else "Self-study rules (no `kata grade` policy flag set)."


SEEDS = ("Seeds: every pair's inputs, public and hidden, come from the class's secret (OUT/.kata/class.json), the "
         "learner and the kata: the same file gets the same grade on every run.")
LOOKALIKES = ("Warning: some learners' names look alike, differing only in Unicode normalisation or in look-alike "
              "letters (a Cyrillic а for a Latin a, say). Each folder was graded as a learner of its own: check "
              "that these are different people.")


def summary_md(katas: list[Kata], results: dict, refused: dict | None = None, warning: str | None = None,
               policy: Policy = SELF_STUDY) -> str:
    n = len(results)
    lines = ["# Class summary", "", *([f"**{warning}**", ""] if warning else []),
             f"{n} learner(s), {len(katas)} kata(s).", "", f"Policy: {policy_text(policy)}", "", SEEDS, "",
             f"Kit: attention-katas {metadata.version('attention-katas')}.", ""]
    lookalikes = lookalike_names(results)
    if lookalikes:   # each spelled out too (ascii), where the eye cannot tell them apart
        lines += [f"**{LOOKALIKES}**", "",
                  *(f"- {', '.join(f'`{name}` {ascii(name)}' for name in group)}" for group in lookalikes), ""]
    lines += ["| kata | passed (all checks) | pass rate | mean score of work handed in | failed with points | graded 0 "
              "| not started | empty | error | missing |", "|---|---|---|---|---|---|---|---|---|---|"]
    diagnoses, checks = Counter(), Counter()
    who = {}   # (slug, standing or diagnosis) -> learners
    for name, by_kata in sorted(results.items()):
        for slug, r in by_kata.items():
            for key in (standing(r), *r["diagnoses"]):
                who.setdefault((slug, key), []).append(f"`{name}`")
    for kata in katas:
        got = [by_kata[kata.slug] for by_kata in results.values() if kata.slug in by_kata]
        status = Counter(standing(r) for r in got)
        handed = [r for r in got if r["status"] not in UNGRADED]
        most = max((r["max_score"] for r in got), default=kata.max_score)   # the same for all: one device
        mean = f"{sum(r['score'] for r in handed) / len(handed):.2f}/{_num(most)}" if handed else "-"
        rate = f"{100 * status['passed'] / len(got):.0f}%" if got else "-"
        counts = [status[key] for key in ("failed", "graded 0", "not-started", "empty", "error", "missing")]
        lines.append(f"| {kata.slug} | {status['passed']} | {rate} | {mean} | {' | '.join(map(str, counts))} |")
        for r in got:
            diagnoses.update((kata.slug, code) for code in r["diagnoses"])
            if r["status"] == "failed":
                checks.update((kata.slug, c["id"]) for c in r["checks"] if c["status"] in ("failed", "error"))
    lines += ["", "## What the class got wrong", ""]
    if diagnoses:
        by_slug = {k.slug: k for k in katas}
        lines += ["| diagnosis | kata | learners | share | what it means | who |", "|---|---|---|---|---|---|"]
        for (slug, code), count in diagnoses.most_common():
            d = by_slug[slug].diagnoses.get(code)
            lines.append(f"| `{code}` | {slug} | {count} | {100 * count / n:.0f}% | {d.explain if d else ''} | "
                         f"{', '.join(who[slug, code])} |")
    else:
        lines.append("No known bug was diagnosed.")
    looks = [(kata.slug, status, who[kata.slug, status]) for kata in katas
             for status in ("error", "missing", "empty", "not-started", "graded 0") if (kata.slug, status) in who]
    if looks:
        lines += ["", "## Learners to look at", "", "| kata | status | who |", "|---|---|---|"]
        lines += [f"| {slug} | {status} | {', '.join(names)} |" for slug, status, names in looks]
    changed = [(name, slug, r["override"]) for name, by_kata in sorted(results.items())
               for slug, r in by_kata.items() if r.get("override")]
    if changed:
        lines += ["", f"## Scores overridden ({OVERRIDES})", "", "| learner | kata | score | graded | reason |",
                  "|---|---|---|---|---|"]
        lines += [f"| `{name}` | {slug} | {_num(o['score'])} | {_num(o['graded'])} | {o['reason']} |"
                  for name, slug, o in changed]
    if refused:
        lines += ["", "## Folders not graded", "", "| folder | why |", "|---|---|"]
        lines += [f"| `{name}` | {why} |" for name, why in refused.items()]
    lines += ["", "## Checks failed most often (by learners who attempted the kata)", ""]
    if checks:
        lines += ["| kata | check | learners |", "|---|---|---|"]
        lines += [f"| {slug} | `{cid}` | {count} |" for (slug, cid), count in checks.most_common(20)]
    else:
        lines.append("None.")
    return "\n".join(lines) + "\n"
