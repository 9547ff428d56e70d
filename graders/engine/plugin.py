"""The pytest plugin that connects a kata's grader to one learner file.

Fixtures for graders: ``learner`` (the adapter), ``case_rng`` (a NumPy generator seeded from the
check's id alone: the structure of its cases, the same at every seed), ``rng`` (the values, seeded
from the run's seed and the check's id, so ``--seed`` replays any check alone; see draws.py),
``kata`` (the manifest), ``bugs`` (the bug oracles), ``device`` ("cpu" or "cuda"). A check is a
``test_*`` function; its id is the name without ``test_``, with ``-`` for ``_``; its name is the
first line of its docstring. ``@pytest.mark.cuda`` checks are skipped, saying why, unless the
run's device is CUDA.

Hidden checks live in the kata's ``hidden`` grader file (a separate file, so a student bundle
leaves them out whole); their ``rng`` is seeded from the run's ``hidden_seed``, fresh for each
grading.
In a bundle (``release`` given) the hidden checks and the checks it recorded no values for are
reported as skipped, and the ``bugs`` fixture replays recorded oracle values.

One session may hold several gradings of the file, at other seeds (``runner.grade_seeds``): the
checks run once per grading, each time with fixtures of their own.
"""
from __future__ import annotations

import ast
import traceback
from pathlib import Path

import pytest

from . import expect
from .draws import case_generator, value_generator
from .failures import CheckFailed
from .learner import Learner
from .manifest import Kata
from .oracles import Bugs
from .structure import TAMPERING
from .tape import Tape

RUN = pytest.StashKey["GradingPlugin"]()


def grader_files(kata: Kata) -> list[Path]:
    """The grader, and the hidden checks' file where there is one (a student bundle has none)."""
    hidden = kata.files["hidden"]
    return [kata.files["grader"]] + ([hidden] if hidden.is_file() else [])


def check_names(path: Path) -> dict[str, str]:
    """{check id: name} of a grader file, read from its source: nothing is imported or run."""
    names = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            cid = _id(node.name)
            names[cid] = (ast.get_docstring(node) or cid).strip().splitlines()[0]
    return names


def cuda_checks(kata: Kata) -> set[str]:
    """The ids of the checks marked ``@pytest.mark.cuda``, read from the graders' source."""
    found = set()
    for path in grader_files(kata):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and any(
                    ast.unparse(d) == "pytest.mark.cuda" for d in node.decorator_list):
                found.add(_id(node.name))
    return found


def check_id(item) -> str:
    return _id(item.originalname)


def _id(function_name: str) -> str:
    return function_name.removeprefix("test_").replace("_", "-")


def check_entry(cid: str, name: str, *, status: str, points: float, message: str = "",
                visibility: str = "visible", duration_s: float = 0.0) -> dict:
    """One check of a result (see result.schema.json); a check that did not pass scores 0."""
    return {"id": cid, "name": name, "status": status, "score": points if status == "passed" else 0.0,
            "max_score": 0.0 if status == "skipped" else points, "message": message, "diagnosis": None,
            "visibility": visibility, "duration_s": duration_s}


def is_hidden(item) -> bool:
    return item.path == item.config.stash[RUN].kata.files["hidden"]


@pytest.fixture(scope="session")
def learner(request):
    return request.config.stash[RUN].adapter


@pytest.fixture
def rng(request):
    run = request.config.stash[RUN]
    return value_generator(run.hidden_seed if is_hidden(request.node) else run.seed, check_id(request.node))


@pytest.fixture
def case_rng(request):
    return case_generator(check_id(request.node))


@pytest.fixture(scope="session")
def kata(request):
    return request.config.stash[RUN].kata


@pytest.fixture(scope="session")
def bugs(request):
    run = request.config.stash[RUN]
    return Bugs(run.kata, run.book, codes=run.release and run.release["codes"])


@pytest.fixture(scope="session")
def device(request):
    return request.config.stash[RUN].device


class GradingPlugin:
    def __init__(self, kata: Kata, gradings: list, *, device: str, release: dict | None = None, trace=None):
        """``gradings``: the gradings of one file (runner.Grading) whose checks this session runs.
        A grading with a ``repro`` folder keeps the calls of each failed public check in its ``tapes``."""
        self.kata, self.gradings, self.device, self.release, self.trace = kata, gradings, device, release, trace
        self.problems: list[str] = []

    def _bind(self, grading):
        """The checks from here on grade ``grading``: its learner, seeds and Book, its reports."""
        self.seed, self.hidden_seed, self.book = grading.seed, grading.hidden_seed, grading.book
        self.reports, self.grading = grading.reports, grading
        self.adapter = Learner(grading.sandbox, device=self.device, seed=grading.seed, trace=self.trace)
        self.adapter.tape = Tape() if grading.repro is not None else None

    # --- hooks ------------------------------------------------------------------------------

    def pytest_configure(self, config):
        config.stash[RUN] = self
        # A failed check reports its own message. pytest's default long traceback would parse the
        # grader's source for every frame, a fifth of a failing run's time; the native one does not.
        config.option.tbstyle = "native"
        config.addinivalue_line("markers", "cuda: the check needs a CUDA device")

    def pytest_collectreport(self, report):
        if report.failed:
            self.problems.append(f"the grader {self.kata.grader_path.name} could not be collected:\n"
                                 f"{report.longreprtext}")

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session):
        """Every check once per grading, in the grader's order. A grading's last check tears every
        fixture down, session-scoped ones too: the next grading sets them up afresh, on its own
        learner, in a sandbox of its own that was forked while this one ran."""
        if session.testsfailed:
            return None   # pytest's own loop reports the collection error
        for grading, following in zip(self.gradings, [*self.gradings[1:], None]):
            grading.start()
            if following is not None:
                following.open()
            self._bind(grading)
            try:
                for item, nextitem in zip(session.items, [*session.items[1:], None]):
                    item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            finally:
                grading.finish()
        return True

    def pytest_collection_modifyitems(self, items):
        found = [check_id(item) for item in items]
        expected = set(self.kata.checks) - set(self.release["hidden"] if self.release else ())
        missing = sorted(expected - set(found))
        unknown = sorted(set(found) - set(self.kata.checks))
        if missing or unknown:
            self.problems.append(
                f"{self.kata.slug}: the grader's checks and kata.toml's [checks] disagree"
                + (f"; no test for {', '.join(missing)}" if missing else "")
                + (f"; no points for {', '.join(unknown)}" if unknown else "") + ".")

    def pytest_runtest_setup(self, item):
        expect.NOTES.clear()
        if self.adapter.tape is not None:
            self.adapter.tape.begin(hidden=is_hidden(item))
        self.book.muted = is_hidden(item)
        if item.get_closest_marker("cuda") and self.device != "cuda":
            pytest.skip("needs a CUDA device: none is present, or the run asked for --device cpu")
        if self.release and check_id(item) not in self.release["recorded"]:
            pytest.skip("this student bundle holds no recorded values for it (it needs a CUDA device, "
                        "which the machine that built the bundle lacked); it runs when your instructor grades")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.reports[check_id(item)] = self._report(item, call, report)

    def _report(self, item, call, report) -> dict:
        cid = check_id(item)
        doc = (item.function.__doc__ or cid).strip().splitlines()[0]
        points = self.kata.checks.get(cid, 0.0)
        entry = check_entry(cid, doc, status="passed", points=points, duration_s=round(report.duration, 3),
                            visibility="hidden" if is_hidden(item) else "visible")
        printed = self.adapter.take_output()
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            return {**entry, "status": "skipped", "score": 0.0, "max_score": 0.0,
                    "message": reason.removeprefix("Skipped: ")}
        if report.passed:
            if expect.NOTES:
                entry.update(notes=list(expect.NOTES), message="\n".join(expect.NOTES.values()))
            return entry
        exc = call.excinfo.value if call.excinfo else None
        if self.adapter.tape is not None and entry["visibility"] == "visible":   # hidden checks keep no tape
            self.grading.tapes[cid] = self.adapter.tape.excerpt()
        if isinstance(exc, CheckFailed):
            diagnosis = exc.diagnosis
            if diagnosis is None and getattr(exc, "forbidden", False) and TAMPERING in self.kata.diagnoses:
                diagnosis = TAMPERING   # a thread or process started: what tampering names, stopped as it began
            entry.update(status=exc.status, message=exc.text(), diagnosis=diagnosis,
                         not_started=type(exc).__name__ == "NotStarted")
            printed = exc.output or printed
        else:
            where = "".join(traceback.format_exception(exc)[-6:]) if exc else report.longreprtext
            entry.update(status="error", message=f"Internal error in the grader (not your fault): {where}")
        if printed:
            entry["output"] = printed
        entry["score"] = 0.0
        return entry
