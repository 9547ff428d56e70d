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
import secrets
import signal
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..engine.manifest import ROOT, Kata
from ..engine.plugin import check_entry, check_names, grader_files

RECORDS = Path(".kata") / "records"
HIDDEN_OUTPUT = "Hidden check failed."
NOT_LOADED = "Not run: the file could not be graded (see this kata's first check)."
OUTPUT_CAP = 4000   # characters of one check's text in results.json and feedback.md
MAX_SUBMISSION_BYTES = 1 << 20   # a kata file is a few kilobytes


@dataclass(frozen=True)
class Pair:
    learner: str
    kata: Kata
    file: Path

    @property
    def label(self) -> str:
        return f"{self.learner}/{self.kata.slug}"


CLASS_FILES = ("grades.csv", "summary.md")   # OUT/<learner>/ must not land on these
NO_SANDBOX = ("WARNING: graded with --no-sandbox: learner code ran without bubblewrap's sandbox, so it "
              "could read the kit, other learners' files and OUT. These grades are not protected against cheating.")


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


def learners(submissions: Path) -> list[str]:
    return learner_folders(submissions)[0]


def atomic_write(path: Path, text: str):
    """Write ``text`` so that readers see the old file or the new one, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _digest(paths) -> str:
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def kit_fingerprint(kata: Kata) -> str:
    """Changes whenever anything that decides this kata's grade changes: its manifest, grader,
    reference and oracles, or the engine. A run re-grades pairs graded by another kit."""
    files = [kata.dir / "kata.toml", *grader_files(kata), kata.reference_path,
             kata.reference_path.with_name(f"{kata.module}_bugs.py"), *(ROOT / "graders" / "engine").glob("*.py")]
    return _digest(p for p in files if p.is_file())


def submission_fingerprint(file: Path) -> str:
    return hashlib.sha256(file.read_bytes()).hexdigest() if file.is_file() else "missing"


# --- results for pairs the runner did not grade ---------------------------------------------------

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


def _grade_in_process(slug: str, file: str, seed: int, device: str, isolated: bool) -> dict:
    from ..engine import manifest
    from ..engine.runner import RunnerError, grade
    from ..engine.sandbox import Zygote

    kata = manifest.find(slug)
    if kata.framework not in _zygotes:
        cuda = kata.framework == "torch" and device != "cpu" and Path("/dev/nvidiactl").exists()
        _zygotes[kata.framework] = Zygote([kata.framework], isolated=isolated, cuda=cuda, warm=True)
    try:
        return grade(kata, Path(file), seed=seed, device=device, zygote=_zygotes[kata.framework])
    except RunnerError as exc:
        return unrun_result(kata, Path(file), "error", f"The kit could not grade this file: {exc}")


# --- the run --------------------------------------------------------------------------------------

class Grading:
    def __init__(self, submissions: Path, out: Path, katas: list[Kata], *, jobs: int, force: bool,
                 seed: int | None, device: str, show_hidden_diagnoses: bool, sandbox: bool = True,
                 refused: dict | None = None):
        """``sandbox``: grade under bwrap (False: --no-sandbox). ``refused``: (learner, slug) ->
        a sentence, for files refused before grading (a notebook that could not be read, say)."""
        self.submissions, self.out, self.katas = Path(submissions), Path(out), katas
        self.jobs, self.force, self.device = max(1, jobs), force, device
        self.seed = secrets.randbelow(2**31) if seed is None else seed
        self.show_hidden_diagnoses, self.sandbox = show_hidden_diagnoses, sandbox
        self.learners, self.refused_folders = learner_folders(self.submissions)
        self.refused = refused or {}
        self.kit = {k.slug: kit_fingerprint(k) for k in katas}
        self.pairs = [Pair(name, kata, self.submissions / name / kata.learner_file)
                      for name in self.learners for kata in katas]

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
                and record.get("kit") == self.kit[pair.kata.slug])

    def save(self, pair: Pair, fingerprint: str, result: dict):
        kit_error = result["status"] == "error" and any(
            c["message"].startswith("The kit could not grade") for c in result["checks"])
        record = {"learner": pair.learner, "kata": pair.kata.slug, "submission": fingerprint,
                  "kit": self.kit[pair.kata.slug], "kit_error": kit_error, "result": result}
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
        # A link out of the learner's own folder could point at the reference or a classmate's file.
        if not pair.file.resolve().is_relative_to((self.submissions / pair.learner).resolve()):
            return "error", f"{name} is a link to a file outside your submission, so it was not graded."
        if pair.file.stat().st_size > MAX_SUBMISSION_BYTES:
            return "error", f"{name} is larger than {MAX_SUBMISSION_BYTES >> 20} MB, so it was not graded."
        return None

    def run(self, pairs: list[Pair], progress=lambda pair, result: None):
        """Grade ``pairs``, saving each as it finishes. A grading process that dies takes its
        pairs with it: they are tried once more in a fresh pool, then recorded as kit errors."""
        graded = []
        for pair in pairs:
            refused = self.refusal(pair)
            if refused is None:
                graded.append(pair)
                continue
            result = unrun_result(pair.kata, pair.file, *refused)
            self.save(pair, submission_fingerprint(pair.file), result)
            progress(pair, result)
        attempts = Counter()
        while graded:
            broken = self._run_pool(graded, progress)
            attempts.update(broken)
            graded = [p for p in broken if attempts[p] < 2]
            for pair in broken:
                if attempts[pair] >= 2:
                    result = unrun_result(pair.kata, pair.file, "error", "The kit could not grade this file: "
                                          "its grading process died twice (see the instructor's log).")
                    self.save(pair, submission_fingerprint(pair.file), result)
                    progress(pair, result)

    def _run_pool(self, pairs: list[Pair], progress) -> list[Pair]:
        context = multiprocessing.get_context("spawn")
        broken = []
        with futures.ProcessPoolExecutor(min(self.jobs, len(pairs)), mp_context=context,
                                         initializer=_init_process) as pool:
            # The fingerprint is taken before grading: a file changed meanwhile is graded again.
            running = {pool.submit(_grade_in_process, p.kata.slug, str(p.file), self.seed, self.device,
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
                    self.save(pair, fingerprint, result)
                    progress(pair, result)
            except KeyboardInterrupt:
                pool.shutdown(wait=True, cancel_futures=True)
                for future, (pair, fingerprint) in running.items():
                    if future.done() and not future.cancelled() and future.exception() is None:
                        self.save(pair, fingerprint, future.result())
                raise
        return broken

    # --- the class files ------------------------------------------------------------------------

    def results(self) -> dict[str, dict[str, dict]]:
        """learner -> slug -> result, for every kata graded in OUT (this run's and earlier ones)."""
        return {name: {k.slug: r["result"] for k in self.all_katas()
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
        unsandboxed = any(r.get("sandbox") == "process" for by_kata in results.values() for r in by_kata.values())
        atomic_write(self.out / "grades.csv", grades_csv(katas, results))
        for name, by_kata in results.items():
            graded = gradescope_results(katas, by_kata, self.show_hidden_diagnoses)
            if unsandboxed:
                graded["output"] = f"{NO_SANDBOX}\n{graded['output']}"
            atomic_write(self.out / name / "results.json", json.dumps(graded, indent=1))
            atomic_write(self.out / name / "feedback.md",
                         feedback_md(name, katas, by_kata, self.show_hidden_diagnoses))
        atomic_write(self.out / "summary.md", summary_md(katas, results, self.refused_folders,
                                                         warning=NO_SANDBOX if unsandboxed else None))


# --- renderings -----------------------------------------------------------------------------------

def _num(x: float) -> str:
    return f"{x:g}"


def _hidden(check: dict) -> bool:
    return check.get("visibility", "visible") == "hidden"


def _capped(text: str) -> str:
    return text if len(text) <= OUTPUT_CAP else text[:OUTPUT_CAP] + "\n… (cut)"


def grades_csv(katas: list[Kata], results: dict) -> str:
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(["learner", *(k.slug for k in katas), "total", "max"])
    for name, by_kata in sorted(results.items()):
        scores = [by_kata[k.slug]["score"] if k.slug in by_kata else 0.0 for k in katas]
        out.writerow([name, *map(_num, scores), _num(round(sum(scores), 6)),
                      _num(round(sum(k.max_score for k in katas), 6))])
    return buf.getvalue()


def _check_text(check: dict, kata: Kata, show_hidden_diagnoses: bool) -> str:
    """What a learner may read about one check."""
    if check["status"] == "passed":
        return ""
    code = check.get("diagnosis")
    diagnosis = kata.diagnoses.get(code) if code else None
    said = [f"Diagnosis: {code}" + (f": {diagnosis.explain} Fix: {diagnosis.fix}" if diagnosis else "")] if code else []
    if _hidden(check):
        if check["status"] == "skipped":
            return "Skipped."
        return "\n".join([HIDDEN_OUTPUT, *(said if show_hidden_diagnoses else [])])
    lines = [check["message"], *said]
    if check.get("output"):
        lines.append("Your code printed:\n" + check["output"])
    return _capped("\n".join(lines))


def gradescope_results(katas: list[Kata], by_kata: dict, show_hidden_diagnoses: bool) -> dict:
    """One learner's grades in Gradescope's results.json format: a test per check."""
    tests, lines = [], []
    for kata in katas:
        result = by_kata.get(kata.slug)
        if result is None:
            continue
        lines.append(f"{kata.slug}: {_num(result['score'])}/{_num(result['max_score'])} ({result['status']})")
        for i, check in enumerate(result["checks"], 1):
            if check["status"] == "skipped" and not _hidden(check):
                continue   # a CUDA-only check on a CPU grader: worth nothing here
            # A file that could not be loaded failed every check for one reason: said once.
            output = (NOT_LOADED if result["status"] == "error" and i > 1
                      else _check_text(check, kata, show_hidden_diagnoses))
            tests.append({"name": f"{kata.slug}: {check['name']}", "number": f"{kata.order}.{i}",
                          "score": check["score"], "max_score": check["max_score"],
                          "status": "passed" if check["status"] == "passed" else "failed",
                          "output": output, "visibility": "visible"})
    return {"score": round(sum(r["score"] for r in by_kata.values()), 6),
            "execution_time": round(sum(r.get("duration_s") or 0 for r in by_kata.values()), 3),
            "output": "\n".join(lines), "visibility": "visible", "stdout_visibility": "hidden",
            "tests": tests}


def feedback_md(name: str, katas: list[Kata], by_kata: dict, show_hidden_diagnoses: bool) -> str:
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
        passed = [c for c in result["checks"] if c["status"] == "passed"]
        if passed:
            lines += ["Passed: " + ", ".join(f"`{c['id']}`" for c in passed) + ".", ""]
        for check in result["checks"]:
            if check["status"] in ("passed", "skipped"):
                continue
            title = "a hidden check" if _hidden(check) else f"`{check['id']}`: {check['name']}"
            lines += [f"### ✗ {title} ({_num(check['score'])}/{_num(check['max_score'])})", "", "```",
                      _check_text(check, kata, show_hidden_diagnoses).replace("```", "'''"), "```", ""]
    return "\n".join(lines)


def summary_md(katas: list[Kata], results: dict, refused: dict | None = None, warning: str | None = None) -> str:
    n = len(results)
    lines = ["# Class summary", "", *([f"**{warning}**", ""] if warning else []),
             f"{n} learner(s), {len(katas)} kata(s).", "",
             "| kata | full score | pass rate | mean score | failed | not started | error | missing |",
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
