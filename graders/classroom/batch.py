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
import hashlib
import io
import json
import multiprocessing
import os
import re
import signal
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..engine.manifest import ROOT, Kata
from ..engine.plugin import check_entry, check_names, grader_files
from ..engine.untrusted import MAX_SUBMISSION_BYTES, TooLarge, read_capped, too_large
from .rules import SELF_STUDY, ClassRules, Policy, atomic_write

RECORDS = Path(".kata") / "records"
HIDDEN_OUTPUT = "Hidden check failed."
NOT_LOADED = "Not run: the file could not be graded (see this kata's first check)."
OUTPUT_CAP = 4000   # characters of one check's text in results.json and feedback.md


@dataclass(frozen=True)
class Pair:
    learner: str
    kata: Kata
    file: Path

    @property
    def label(self) -> str:
        return f"{self.learner}/{self.kata.slug}"


CLASS_FILES = ("grades.csv", "summary.md")   # OUT/<learner>/ must not land on these
NO_SANDBOX = ("WARNING: graded with --no-sandbox: learner code ran without a sandbox, in a separate process only "
              "(as root where no other user could read Python's installation), so it could read the kit, other "
              "learners' files and OUT. These grades are not protected against cheating.")
CONTAINER = ("Sandbox: container (--container): bubblewrap could not make namespaces in this grading container, "
             "so learner code ran as an unprivileged user of the container, who can read neither the kit nor "
             "the class's files, one user per grading process.")


def learner_folders(submissions: Path) -> tuple[list[str], dict[str, str]]:
    """The learners of SUBMISSIONS, and the folders refused as learners (a printable name -> why).
    A folder is a learner when it is a real folder (not a link, which could point at the kit)
    whose name can name files in OUT and lines of grades.csv and summary.md."""
    names, refused = [], {}
    for path in sorted(submissions.iterdir(), key=lambda p: os.fsencode(p.name)):
        name = path.name
        if name.startswith(".") or not (path.is_dir() or path.is_symlink()):
            continue
        shown = os.fsencode(name).decode("utf-8", "backslashreplace")
        if not shown.isprintable():
            shown = shown.encode("unicode_escape").decode("ascii")
        if path.is_symlink():
            refused[shown] = "it is a symbolic link, not a folder"
        elif shown != name:
            refused[shown] = "its name is not printable UTF-8 text"
        elif name in CLASS_FILES:
            refused[name] = f"its name is that of OUT/{name}, a file of the class's grades"
        else:
            names.append(name)
    return names, refused


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
    files = [kata.dir / "kata.toml", *grader_files(kata), kata.reference_path,
             *(kata.reference_path.with_name(f"{kata.module}_{part}.py") for part in ("bugs", "expected")),
             *(ROOT / "graders" / "engine").glob("*.py")]
    return _digest(p for p in files if p.is_file())


def submission_fingerprint(file: Path) -> str:
    """The file's sha256; a file too large to grade is not read (it is refused unread)."""
    if not file.is_file():
        return "missing"
    try:
        return hashlib.sha256(read_capped(file)).hexdigest()
    except TooLarge:
        return f"larger than {MAX_SUBMISSION_BYTES} bytes"


def linked_out(file: Path, folder: Path) -> str | None:
    """A sentence if ``file`` leads out of ``folder``, a learner's own, through a symbolic link
    (of the file or of a folder on its way), else None: it could point at the reference, a
    course's source notebooks or a classmate's file."""
    if file.resolve().is_relative_to(folder.resolve()):
        return None
    return f"{file.name} is a link to a file outside your submission, so it was not graded."


# --- results for pairs the runner did not grade ---------------------------------------------------

def _graded(result: dict) -> dict:
    """What a replay must reproduce: the result without how long it took or where the file was."""
    timing = ("duration_s", "file")
    return {**{k: v for k, v in result.items() if k not in timing},
            "checks": [{k: v for k, v in c.items() if k not in timing} for c in result["checks"]]}


def unrun_result(kata: Kata, file: Path, status: str, message: str) -> dict:
    """A complete result in which every check failed for one reason (no file, a kit failure)."""
    names = {cid: name for path in grader_files(kata) for cid, name in check_names(path).items()}
    checks = [check_entry(cid, names.get(cid) or cid, status="failed" if status == "missing" else "error",
                          points=points, message=message)
              for cid, points in kata.checks.items()]
    return {"kata": kata.slug, "file": str(file), "status": status, "score": 0.0,
            "max_score": kata.max_score, "seed": None, "device": "cpu", "duration_s": 0.0,
            "checks": checks, "diagnoses": []}


# --- the pool of trusted grading processes --------------------------------------------------------

# Each grading process forks its sandboxes from warm zygotes, one per framework: the same
# zygote `kata check` would start, so nothing in the sandbox tells a graded run from a check.
_zygotes = {}


def _init_process():
    # Ctrl-C reaches the whole foreground group: the parent decides, and lets running pairs finish.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    atexit.register(lambda: [zygote.close() for zygote in _zygotes.values()])
    import torch

    torch.set_num_threads(1)   # one process per core already


def _grade_in_process(slug: str, file: str, seeds: tuple[int, int], device: str, sandbox: str) -> dict:
    from ..engine import manifest
    from ..engine.runner import RunnerError, grade
    from ..engine.sandbox import Zygote

    kata = manifest.find(slug)
    if kata.framework not in _zygotes:
        cuda = kata.framework == "torch" and device != "cpu" and Path("/dev/nvidiactl").exists()
        _zygotes[kata.framework] = Zygote([kata.framework], isolated=sandbox == "bwrap",
                                          container=sandbox == "container", cuda=cuda, warm=True)
    try:
        return grade(kata, Path(file), seed=seeds[0], hidden_seed=seeds[1], device=device,
                     zygote=_zygotes[kata.framework])
    except RunnerError as exc:
        return unrun_result(kata, Path(file), "error", f"The kit could not grade this file: {exc}")


# --- the run --------------------------------------------------------------------------------------

class Grading:
    def __init__(self, submissions: Path, out: Path, katas: list[Kata], *, jobs: int, force: bool,
                 rules: ClassRules, device: str, show_hidden_diagnoses: bool, sandbox: str = "bwrap",
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
        self.show_hidden_diagnoses, self.sandbox = show_hidden_diagnoses, sandbox
        self.learners, found = learner_folders(self.submissions)
        self.refused_folders = {**(refused_folders or {}), **found}
        self.refused = refused or {}
        self.kit = {k.slug: kit_fingerprint(k) for k in katas}
        self.pairs = [Pair(name, kata, self.submissions / name / kata.learner_file)
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
                  "result": result}
        atomic_write(self.record_path(pair.learner, pair.kata.slug), json.dumps(record, indent=1))

    def todo(self) -> list[Pair]:
        return [p for p in self.pairs if self.force or not self.is_current(p)]

    def refusal(self, pair: Pair) -> tuple[str, str] | None:
        """(status, message) for a file that is not graded at all, else None."""
        name = pair.kata.learner_file
        if (pair.learner, pair.kata.slug) in self.refused:
            return "error", self.refused[pair.learner, pair.kata.slug]
        if not pair.file.is_file():
            return "missing", f"No {name} was submitted."
        refused = linked_out(pair.file, self.submissions / pair.learner) or too_large(pair.file)
        return None if refused is None else ("error", refused)

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
            finished(pair, submission_fingerprint(pair.file), unrun_result(pair.kata, pair.file, *refused))
        attempts = Counter()   # by label: a Pair holds its Kata, which is not hashable
        while graded:
            broken = self._run_pool(graded, finished)
            attempts.update(p.label for p in broken)
            graded = [p for p in broken if attempts[p.label] < 2]
            for pair in broken:
                if attempts[pair.label] >= 2:
                    result = unrun_result(pair.kata, pair.file, "error", "The kit could not grade this file: "
                                          "its grading process died twice (see the instructor's log).")
                    finished(pair, submission_fingerprint(pair.file), result)

    def replay(self) -> list[tuple[Pair, dict, bool | str]]:
        """Grade this run's pairs again at the class's seeds, saving nothing: (pair, the result
        now, True if it is the recorded one, else a sentence saying what differs) for each."""
        now = {}
        self.run(self.pairs, lambda pair, result: now.__setitem__(pair.label, result), keep=False)
        return [(p, now[p.label], self._same_as_recorded(p, now[p.label])) for p in self.pairs]

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
               "same file, kit and seeds: please report this as a bug of the kit")
        return f"DIFFERENT from the recorded {before['score']:g}/{before['max_score']:g} ({before['status']}): {why}."

    def _run_pool(self, pairs: list[Pair], finished) -> list[Pair]:
        context = multiprocessing.get_context("spawn")
        broken = []
        with futures.ProcessPoolExecutor(min(self.jobs, len(pairs)), mp_context=context,
                                         initializer=_init_process) as pool:
            # The fingerprint is taken before grading: a file changed meanwhile is graded again.
            running = {pool.submit(_grade_in_process, p.kata.slug, str(p.file), self.seeds(p), self.device,
                                   self.sandbox):
                       (p, submission_fingerprint(p.file)) for p in pairs}
            try:
                for future in futures.as_completed(running):
                    pair, fingerprint = running[future]
                    try:
                        result = future.result()
                    except futures.process.BrokenProcessPool:
                        broken.append(pair)
                        continue
                    finished(pair, fingerprint, result)
            except KeyboardInterrupt:
                pool.shutdown(wait=True, cancel_futures=True)
                for future, (pair, fingerprint) in running.items():
                    if future.done() and not future.cancelled() and future.exception() is None:
                        finished(pair, fingerprint, future.result())
                raise
        return broken

    # --- the class files ------------------------------------------------------------------------

    def results(self) -> dict[str, dict[str, dict]]:
        """learner -> slug -> result as the class's policy grades it, for every kata graded in OUT
        (this run's and earlier ones)."""
        return {name: {k.slug: self.rules.policy.apply(r["result"]) for k in self.all_katas()
                       if (r := self.load_record(name, k.slug)) is not None}
                for name in self.learners}

    def all_katas(self) -> list[Kata]:
        from ..engine import manifest

        recorded = {p.stem for p in (self.out / RECORDS).glob("*/*.json")}
        wanted = {k.slug for k in self.katas}
        return [k for k in manifest.katas() if k.slug in wanted or k.slug in recorded]

    def write_class_files(self):
        katas = self.all_katas()
        results = self.results()
        # A result graded without bwrap (now or in an earlier run) warns in every class file.
        modes = {r.get("sandbox") for by_kata in results.values() for r in by_kata.values()}
        unsandboxed = "process" in modes
        atomic_write(self.out / "grades.csv", grades_csv(katas, results))
        for name, by_kata in results.items():
            graded = gradescope_results(katas, by_kata, self.show_hidden_diagnoses, self.rules.policy)
            if unsandboxed:
                graded["output"] = f"{NO_SANDBOX}\n{graded['output']}"
            atomic_write(self.out / name / "results.json", json.dumps(graded, indent=1))
            atomic_write(self.out / name / "feedback.md",
                         feedback_md(name, katas, by_kata, self.show_hidden_diagnoses, self.rules.policy))
        atomic_write(self.out / "summary.md", summary_md(katas, results, self.refused_folders,
                                                         warning=NO_SANDBOX if unsandboxed else
                                                         CONTAINER if "container" in modes else None,
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


def grades_csv(katas: list[Kata], results: dict) -> str:
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    rows = [["learner", *(k.slug for k in katas), "total", "max"]]
    for name, by_kata in sorted(results.items()):
        scores = [by_kata[k.slug]["score"] if k.slug in by_kata else 0.0 for k in katas]
        rows.append([name, *map(_num, scores), _num(round(sum(scores), 6)),
                     _num(round(sum(k.max_score for k in katas), 6))])
    out.writerows([_cell(text) for text in row] for row in rows)
    return buf.getvalue()


def _check_text(check: dict, kata: Kata, show_hidden_diagnoses: bool, policy: Policy) -> str:
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
        return "\n".join([HIDDEN_OUTPUT, *(said if show_hidden_diagnoses else [])])
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


BANNED_NOTE = "Uses a banned API: under this class's rules the kata scores 0."


def gradescope_results(katas: list[Kata], by_kata: dict, show_hidden_diagnoses: bool,
                       policy: Policy = SELF_STUDY) -> dict:
    """One learner's grades in Gradescope's results.json format: a test per check."""
    tests, lines = [], []
    for kata in katas:
        result = by_kata.get(kata.slug)
        if result is None:
            continue
        lines.append(f"{kata.slug}: {_num(result['score'])}/{_num(result['max_score'])} ({result['status']})"
                     + (f" {BANNED_NOTE}" if result.get("banned") else ""))
        titles = _titles(result, policy)
        for i, check in enumerate(result["checks"], 1):
            if check["status"] == "skipped" and not _hidden(check):
                continue   # a CUDA-only check on a CPU grader: worth nothing here
            # A file that could not be loaded failed every check for one reason: said once.
            output = (NOT_LOADED if result["status"] == "error" and i > 1
                      else _check_text(check, kata, show_hidden_diagnoses, policy))
            later = policy.hide_hidden and _hidden(check)
            tests.append({"name": f"{kata.slug}: {titles[check['id']]}", "number": f"{kata.order}.{i}",
                          "score": check["score"], "max_score": check["max_score"],
                          "status": "passed" if check["status"] == "passed" else "failed",
                          "output": output, "visibility": "after_due_date" if later else "visible"})
    return {"score": round(sum(r["score"] for r in by_kata.values()), 6),
            "execution_time": round(sum(r.get("duration_s") or 0 for r in by_kata.values()), 3),
            "output": "\n".join(lines), "visibility": "visible", "stdout_visibility": "hidden",
            "tests": tests}


def feedback_md(name: str, katas: list[Kata], by_kata: dict, show_hidden_diagnoses: bool,
                policy: Policy = SELF_STUDY) -> str:
    total = sum(r["score"] for r in by_kata.values())
    most = sum(r["max_score"] for r in by_kata.values())
    lines = [f"# Feedback for {name}", "", f"Total: **{_num(total)}/{_num(most)}** points.", ""]
    for kata in katas:
        result = by_kata.get(kata.slug)
        if result is None:
            continue
        lines += [f"## {kata.slug}: {kata.title}: {_num(result['score'])}/{_num(result['max_score'])} "
                  f"({result['status']})", ""]
        if result["status"] == "missing":
            lines += [f"No `{kata.learner_file}` was submitted.", ""]
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
                      _check_text(check, kata, show_hidden_diagnoses, policy).replace("```", "'''"), "```", ""]
    return "\n".join(lines)


def policy_text(policy: Policy) -> str:
    said = [what for on, what in ((policy.banned_fails, "a banned API scores the kata 0"),
                                  (policy.withhold_fixes, "feedback withholds the fixes"),
                                  (policy.hide_hidden, ("hidden checks are unnamed to learners (Gradescope: "
                                                        "shown after the due date)"))) if on]
    text = "; ".join(said)
    return f"{text[0].upper()}{text[1:]}." if said else "Self-study rules (no `kata grade` policy flag set)."


LOOKALIKES = ("Warning: some learners' names look alike, differing only in Unicode normalisation or in look-alike "
              "letters (a Cyrillic а for a Latin a, say). Each folder was graded as a learner of its own: check "
              "that these are different people.")


def summary_md(katas: list[Kata], results: dict, refused: dict | None = None, warning: str | None = None,
               policy: Policy = SELF_STUDY) -> str:
    n = len(results)
    lines = ["# Class summary", "", *([f"**{warning}**", ""] if warning else []),
             f"{n} learner(s), {len(katas)} kata(s).", "", f"Policy: {policy_text(policy)}", ""]
    lookalikes = lookalike_names(results)
    if lookalikes:   # each spelled out too (ascii), where the eye cannot tell them apart
        lines += [f"**{LOOKALIKES}**", "",
                  *(f"- {', '.join(f'`{name}` {ascii(name)}' for name in group)}" for group in lookalikes), ""]
    lines += ["| kata | full score | pass rate | mean score | failed | not started | error | missing |",
              "|---|---|---|---|---|---|---|---|"]
    diagnoses, checks = Counter(), Counter()
    for kata in katas:
        got = [by_kata[kata.slug] for by_kata in results.values() if kata.slug in by_kata]
        status = Counter(r["status"] for r in got)
        mean = sum(r["score"] for r in got) / len(got) if got else 0.0
        rate = f"{100 * status['passed'] / len(got):.0f}%" if got else "-"
        lines.append(f"| {kata.slug} | {status['passed']} | {rate} | {mean:.2f}/{_num(kata.max_score)} | "
                     f"{status['failed']} | {status['not-started']} | {status['error']} | {status['missing']} |")
        for r in got:
            diagnoses.update((kata.slug, code) for code in r["diagnoses"])
            if r["status"] == "failed":
                checks.update((kata.slug, c["id"]) for c in r["checks"] if c["status"] in ("failed", "error"))
    lines += ["", "## What the class got wrong", ""]
    if diagnoses:
        by_slug = {k.slug: k for k in katas}
        lines += ["| diagnosis | kata | learners | share | what it means |", "|---|---|---|---|---|"]
        for (slug, code), count in diagnoses.most_common():
            d = by_slug[slug].diagnoses.get(code)
            lines.append(f"| `{code}` | {slug} | {count} | {100 * count / n:.0f}% | {d.explain if d else ''} |")
    else:
        lines.append("No known bug was diagnosed.")
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
