"""An nbgrader course end to end, with the real nbgrader: `kata nbgrader init`, `nbgrader
generate_assignment`, learners' notebooks in submitted/, `kata nbgrader autograde`, `nbgrader export`."""
import ast
import csv
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graders.engine.manifest import find
from graders.practice.notebook import grade_notebook, stub_cell

from conftest import needs_bwrap

# One course, autograded once: one worker runs them all.
pytestmark = [needs_bwrap, pytest.mark.xdist_group("nbgrader")]

KATA = Path(sys.executable).with_name("kata")
KATAS = ("softmax", "causal-mask", "mha")
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}   # nbgrader runs alembic
OVERFLOW = ("import numpy as np\n\ndef softmax(x, axis=-1):\n    e = np.exp(x)\n"
            "    return e / e.sum(axis=axis, keepdims=True)\n")
PATCHED = "import numpy as np\nnp.allclose = lambda *a, **k: True\nnp.testing.assert_allclose = lambda *a, **k: None\n" + OVERFLOW


def run(*cmd, cwd):
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def reference(slug):
    return find(slug).reference_path.read_text()


CLASS = {   # student -> {kata: solution cell code (None: the released stub untouched)}; absent kata: no notebook
    "alice": {slug: reference(slug) for slug in KATAS},
    "bob": {slug: None for slug in KATAS},
    "carol": {"softmax": OVERFLOW},
    "dave": {"softmax": "import os\nos._exit(0)\n", "causal-mask": "def causal_mask(n\n"},
    "erin": {"softmax": PATCHED},
    "frank": {"mha": reference("mha")},
}
# A student as students write notebooks: the import and a helper in a cell of their own above the
# solution cell, pasted over (the kit's first comment line gone), a scratch cell below.
HELPER = ("import numpy as np\n\n\ndef shifted_exp(x, axis):\n"
          "    return np.exp(x - x.max(axis=axis, keepdims=True))\n")
USES_HELPER = "def softmax(x, axis=-1):\n    e = shifted_exp(x, axis)\n    return e / e.sum(axis=axis, keepdims=True)\n"


def in_own_cells(nb: dict) -> dict:
    """``nb`` (softmax's released notebook) as ivan hands it in."""
    at, solution = next((i, c) for i, c in enumerate(nb["cells"]) if c["metadata"].get("nbgrader", {}).get("solution"))
    solution["source"] = USES_HELPER
    helper = {"cell_type": "code", "id": "ivan-helper", "metadata": {}, "source": HELPER, "outputs": [],
              "execution_count": None}
    nb["cells"][at:at] = [helper]
    nb["cells"].append({**helper, "id": "ivan-scratch", "source": "softmax(np.ones(3))\n"})
    return nb


# Notebooks that are no notebook: refused one by one, with the reason; the class is graded.
MALFORMED = {"grace": '{"cells": [{"cell_type": "code", "metadata": "tags", "source": 1}]}',
             "heidi": '{"cells": ' + "[" * 50_000 + "]" * 50_000 + "}"}


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    course = tmp_path_factory.mktemp("course")
    run(KATA, "nbgrader", "init", course, "--assignment", "ps1", "--katas", ",".join(KATAS), cwd=course)
    run(sys.executable, "-m", "nbgrader", "generate_assignment", "ps1", "--force", cwd=course)
    for student, solutions in CLASS.items():
        folder = course / "submitted" / student / "ps1"
        folder.mkdir(parents=True)
        for slug, code in solutions.items():
            module = find(slug).module
            nb = json.loads((course / "release" / "ps1" / f"{module}.ipynb").read_text())
            if code is not None:
                cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("solution"))
                cell["source"] = "".join(cell["source"]).split("\n")[0] + "\n" + code
            (folder / f"{module}.ipynb").write_text(json.dumps(nb))
    for student, text in MALFORMED.items():
        folder = course / "submitted" / student / "ps1"
        folder.mkdir(parents=True)
        (folder / "softmax.ipynb").write_text(text)
    ivan = course / "submitted" / "ivan" / "ps1"
    ivan.mkdir(parents=True)
    (ivan / "softmax.ipynb").write_text(json.dumps(in_own_cells(
        json.loads((course / "release" / "ps1" / "softmax.ipynb").read_text()))))
    (course / "submitted" / "grace" / "ps1" / "mha.ipynb").write_text(
        (course / "submitted" / "alice" / "ps1" / "mha.ipynb").read_text())
    graded = run(KATA, "nbgrader", "autograde", course, "ps1", cwd=course)
    return course, graded


def exported(course):
    run(sys.executable, "-m", "nbgrader", "export", cwd=course)
    with open(course / "grades.csv", newline="") as f:
        return {row["student_id"]: row for row in csv.DictReader(f)}


def test_nbgrader_export_gives_the_kits_scores(course):
    course, _ = course
    rows = exported(course)
    most = sum(find(slug).max_score for slug in KATAS)
    assert {s: float(r["max_score"]) for s, r in rows.items()} == {s: most for s in [*CLASS, *MALFORMED, "ivan"]}
    score = {s: float(r["raw_score"]) for s, r in rows.items()}
    assert score["alice"] == most
    assert score["bob"] == score["dave"] == 0
    assert 0 < score["carol"] < find("softmax").max_score     # right except for large logits
    assert score["erin"] <= score["carol"]                      # patching numpy earns nothing
    assert score["frank"] == find("mha").max_score             # two notebooks missing
    assert score["grace"] == find("mha").max_score and score["heidi"] == 0   # malformed: refused alone
    assert score["ivan"] == find("softmax").max_score   # a helper in a cell of its own counts


def test_a_notebook_is_graded_as_nbgrader_runs_it_and_the_feedback_names_the_cells(course):
    course, _ = course
    feedback = " ".join((course / "kata" / "ps1" / "ivan" / "feedback.md").read_text().split())
    # cells: task, helper, solution, a test cell per check, scratch
    cells = 3 + len(find("softmax").checks) + 1
    assert (f"Graded: cells 2, 3 and {cells} of softmax.ipynb, your code cells in order (the test and check "
            "cells left out).") in feedback, feedback
    graded = json.loads((course / "autograded" / "ivan" / "ps1" / "softmax.ipynb").read_text())
    code = "".join(next(c for c in graded["cells"] if c["metadata"].get("nbgrader", {}).get("solution"))["source"])
    assert code.index("def shifted_exp") < code.index("def softmax") < code.index("softmax(np.ones(3))")


def test_the_test_cells_self_check_a_pasted_over_solution_cell(course, tmp_path):
    """The released test cells, run by a kernel as the student runs them (or `nbgrader validate`):
    they find the solution by nbgrader's metadata, not by the kit's first comment line."""
    import nbformat
    from nbclient import NotebookClient

    course, _ = course
    path = tmp_path / "softmax.ipynb"
    path.write_text((course / "submitted" / "ivan" / "ps1" / "softmax.ipynb").read_text())
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    tests = [c for c in nb.cells if "check_cell(" in c.source]   # the hidden ones' code is not released
    shown = [re.sub(r"\x1b\[[0-9;]*m", "", "".join(o.get("text", "") for o in c.outputs)) for c in tests]
    assert tests and all(text.lstrip().startswith("✓") for text in shown), shown


def test_a_malformed_notebook_is_refused_with_its_reason(course):
    course, _ = course
    for student in MALFORMED:
        feedback = (course / "kata" / "ps1" / student / "feedback.md").read_text()
        assert "softmax.ipynb is not a readable notebook" in feedback, feedback


def answer_lines(kata) -> set[str]:
    """Every line of the reference that the stub does not share: the answer, but for the module's
    docstring and imports."""
    text = kata.reference_path.read_text()
    doc = (ast.get_docstring(ast.parse(text)) or "").splitlines() or [""]
    preamble = {line.strip() for line in doc} | {f'"""{doc[0]}'}
    return {line.strip() for line in text.splitlines() if not line.startswith(("import ", "from "))} - \
        {line.strip() for line in kata.stub_path.read_text().splitlines()} - preamble - {"", '"""'}


def test_the_released_notebooks_hold_the_stub_and_no_reference_code(course):
    course, _ = course
    for slug in KATAS:
        kata = find(slug)
        cells = json.loads((course / "release" / "ps1" / f"{kata.module}.ipynb").read_text())["cells"]
        # The task (markdown) names the API on purpose; the code cells must not hold the answers.
        released = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        assert not answer_lines(kata) & {line.strip() for line in released.splitlines()}, slug
        text = kata.reference_path.read_text()
        solution, = (c for c in cells if c["metadata"].get("nbgrader", {}).get("solution"))
        assert "".join(solution["source"]) == stub_cell(kata)   # what `kata start` gives
        assert "BEGIN HIDDEN TESTS" not in released
        source = json.loads((course / "source" / "ps1" / f"{kata.module}.ipynb").read_text())["cells"]
        # The whole reference between the delimiters: a stock nbgrader, without the kit's config, clears it all.
        cleared = "".join(source[1]["source"]).split("### BEGIN SOLUTION\n")[1].split("### END SOLUTION")[0]
        assert cleared.strip() == text.strip()
        hidden = [c["metadata"]["nbgrader"]["grade_id"] for c in source if "BEGIN HIDDEN TESTS" in "".join(c["source"])]
        assert hidden, slug
        for grade_id in hidden:   # the cell stays (its points count), its code is gone
            cell = next(c for c in cells if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
            assert "check_cell" not in "".join(cell["source"])


def test_an_untouched_release_is_not_started_and_the_source_solution_scores_full(course, zygotes):
    course, _ = course
    kata = find("softmax")
    options = {"seed": 1, "device": "cpu", "zygote": zygotes(kata.framework)}
    untouched = grade_notebook(kata, course / "submitted" / "bob" / "ps1" / "softmax.ipynb", **options)
    assert untouched["status"] == "not-started"
    source = grade_notebook(kata, course / "source" / "ps1" / "softmax.ipynb", **options)
    assert (source["status"], source["score"]) == ("passed", kata.max_score)


def test_autograde_again_keeps_the_scores_and_writes_the_kits_feedback(course):
    course, first = course
    again = run(KATA, "nbgrader", "autograde", course, "ps1", cwd=course)
    assert again.stdout == first.stdout
    assert "softmax-overflow" in (course / "kata" / "ps1" / "carol" / "feedback.md").read_text()
    assert float(exported(course)["alice"]["raw_score"]) == sum(find(slug).max_score for slug in KATAS)


def test_the_class_policy_applies_to_a_course(course):
    """The policy flags of `kata grade` are the course's too, kept with its records."""
    course, first = course
    feedback = course / "kata" / "ps1" / "carol" / "feedback.md"
    assert "Fix:" in feedback.read_text()
    strict = run(KATA, "nbgrader", "autograde", course, "ps1", "--withhold-fixes", cwd=course)
    assert strict.stdout == first.stdout   # the same scores: only what learners read changed

    def withheld():
        rules = json.loads((course / "kata" / "ps1" / ".kata" / "class.json").read_text())
        assert rules["policy"]["withhold_fixes"] is True
        assert "softmax-overflow" in feedback.read_text() and "Fix:" not in feedback.read_text()

    withheld()
    run(KATA, "nbgrader", "autograde", course, "ps1", cwd=course)
    withheld()   # kept in the course's class file: a run without the flag keeps the rule
    run(KATA, "nbgrader", "autograde", course, "ps1", "--show-fixes", cwd=course)
    assert "Fix:" in feedback.read_text()


# --- nbgrader's whole round trip, through its own exchange ----------------------------------------

ROUND_TRIP = ("softmax", "causal-mask")


def exchanged(exchange: Path) -> list[str]:
    """A student's options for nbgrader's exchange (its cache, where submissions are remembered
    for fetch_feedback, beside it rather than in this user's home)."""
    return ["--course", "course", f"--Exchange.root={exchange}", f"--Exchange.cache={exchange.with_name('cache')}"]


def student_submits(exchange: Path, home: Path, student: str, solutions: dict[str, str | None]):
    """What a student does: fetch the released assignment, write the solution cells (None: delete
    that notebook), submit."""
    home.mkdir()
    run(sys.executable, "-m", "nbgrader", "fetch_assignment", "ps1", *exchanged(exchange), cwd=home)
    for slug, code in solutions.items():
        path = home / "ps1" / f"{find(slug).module}.ipynb"
        if code is None:
            path.unlink()
            continue
        nb = json.loads(path.read_text())
        cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("solution"))
        cell["source"] = "".join(cell["source"]).split("\n")[0] + "\n" + code
        path.write_text(json.dumps(nb))
    run(sys.executable, "-m", "nbgrader", "submit", "ps1", *exchanged(exchange), "--student", student, cwd=home)


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory):
    """generate_assignment, release, fetch and submit (alice on time, bob after the due date, a
    late penalty of 'zero' set in the course's config), collect, `kata nbgrader autograde`,
    generate_feedback and export: every command nbgrader's own, but the kit's autograde."""
    base = tmp_path_factory.mktemp("round-trip")
    course, exchange = base / "course", base / "exchange"
    run(KATA, "nbgrader", "init", course, "--assignment", "ps1", "--katas", ",".join(ROUND_TRIP), cwd=base)
    with open(course / "nbgrader_config.py", "a") as f:
        f.write(f"c.Exchange.root = {str(exchange)!r}\nc.LateSubmissionPlugin.penalty_method = 'zero'\n")
    nbgrader = (sys.executable, "-m", "nbgrader")
    run(*nbgrader, "generate_assignment", "ps1", cwd=course)
    run(*nbgrader, "release_assignment", "ps1", cwd=course)
    student_submits(exchange, base / "alice", "alice", {slug: reference(slug) for slug in ROUND_TRIP})
    time.sleep(1.1)   # nbgrader's timestamps: the due date falls between the two submissions
    due = datetime.datetime.now(datetime.timezone.utc)
    time.sleep(1.1)
    student_submits(exchange, base / "bob", "bob", {"softmax": OVERFLOW, "causal-mask": None})
    run(*nbgrader, "db", "assignment", "add", "ps1", f"--duedate={due.isoformat()}", cwd=course)
    run(*nbgrader, "collect", "ps1", cwd=course)
    run(KATA, "nbgrader", "autograde", course, "ps1", cwd=course)
    run(*nbgrader, "generate_feedback", "ps1", cwd=course)
    run(*nbgrader, "release_feedback", "ps1", cwd=course)
    run(*nbgrader, "fetch_feedback", "ps1", *exchanged(exchange), "--student", "alice", cwd=base / "alice")
    return course


def test_generate_feedback_renders_the_kits_grades_for_each_student(round_trip):
    course = round_trip
    for student in ("alice", "bob"):
        for slug in ROUND_TRIP:
            module = find(slug).module
            assert (course / "autograded" / student / "ps1" / f"{module}.ipynb").is_file()
            html = (course / "feedback" / student / "ps1" / f"{module}.html").read_text()
            assert "graded by the kit" in html, student
            if student == "bob":   # what the student wrote, never the source's solution
                notebook = (course / "autograded" / student / "ps1" / f"{module}.ipynb").read_text()
                code = "".join("".join(c["source"]) for c in json.loads(notebook)["cells"] if c["cell_type"] == "code")
                assert not answer_lines(find(slug)) & {line.strip() for line in code.splitlines()}, slug
    fetched = {p.name for p in (course.parent / "alice" / "ps1" / "feedback").glob("*/*.html")}
    assert fetched == {f"{find(slug).module}.html" for slug in ROUND_TRIP}   # back to the student
    softmax = (course / "feedback" / "bob" / "ps1" / "softmax.html").read_text()
    assert "softmax-overflow" in softmax   # the kit's diagnosis, in the student's own feedback
    assert "No causal_mask.ipynb was submitted" in (course / "feedback" / "bob" / "ps1" / "causal_mask.html").read_text()


def test_autograded_cells_need_no_manual_grading(round_trip):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{round_trip / 'gradebook.db'}") as gb:
        for student in ("alice", "bob"):
            submission = gb.find_submission("ps1", student)
            assert submission.needs_manual_grade is False, student
            assert all(not g.needs_manual_grade for nb in submission.notebooks for g in nb.grades)


def test_export_has_the_submission_times_and_nbgraders_late_penalty(round_trip):
    rows = exported(round_trip)
    most = sum(find(slug).max_score for slug in ROUND_TRIP)
    for student in ("alice", "bob"):
        stamp = (round_trip / "submitted" / student / "ps1" / "timestamp.txt").read_text().strip()
        assert rows[student]["timestamp"] and rows[student]["timestamp"][:19] == stamp.replace("T", " ")[:19]
    alice, bob = rows["alice"], rows["bob"]
    assert (float(alice["raw_score"]), float(alice["late_submission_penalty"]), float(alice["score"])) == (most, 0, most)
    assert float(bob["raw_score"]) > 0   # the overflowing softmax keeps most of its points ...
    assert float(bob["late_submission_penalty"]) == float(bob["raw_score"]) and float(bob["score"]) == 0   # ... but is late


def test_a_manual_score_from_the_formgrader_survives_autograde_again(round_trip):
    """nbgrader's own override: a grader's manual score stands, and the kit's next autograde sets
    only the auto score beneath it (the cell then awaits review, as nbgrader's autograde marks it)."""
    from nbgrader.api import Gradebook

    grade_id = "softmax-stable-for-large-logits"   # failed by bob's overflowing softmax
    with Gradebook(f"sqlite:///{round_trip / 'gradebook.db'}") as gb:
        grade = gb.find_grade(grade_id, "softmax", "ps1", "bob")
        assert grade.auto_score == 0
        grade.manual_score = grade.max_score
        gb.db.commit()
    raw = float(exported(round_trip)["bob"]["raw_score"])
    run(KATA, "nbgrader", "autograde", round_trip, "ps1", cwd=round_trip)
    with Gradebook(f"sqlite:///{round_trip / 'gradebook.db'}") as gb:
        grade = gb.find_grade(grade_id, "softmax", "ps1", "bob")
        assert (grade.auto_score, grade.manual_score, grade.score) == (0, grade.max_score, grade.max_score)
        assert grade.needs_manual_grade
    assert float(exported(round_trip)["bob"]["raw_score"]) == raw
    # The course's own class files count it as nbgrader does, and say whose score it is.
    kit = round_trip / "kata" / "ps1"
    with open(kit / "grades.csv", newline="") as f:
        assert float(next(r for r in csv.DictReader(f) if r["learner"] == "bob")["total"]) == raw
    assert "a grader's score in nbgrader's formgrader, for `stable-for-large-logits`" in (kit / "bob" / "feedback.md").read_text()


def test_autograde_replays_and_forces_as_kata_grade_does(round_trip):
    records = sorted((round_trip / "kata" / "ps1" / ".kata" / "records").rglob("softmax.json"))
    before = {p: p.stat().st_mtime_ns for p in records}
    replayed = run(KATA, "nbgrader", "autograde", round_trip, "ps1", "--katas", "softmax", "--replay", cwd=round_trip)
    lines = replayed.stdout.splitlines()
    assert len(lines) == len(records) and all(line.endswith("the same grade as recorded.") for line in lines), lines
    assert {p: p.stat().st_mtime_ns for p in records} == before   # a replay saves nothing
    run(KATA, "nbgrader", "autograde", round_trip, "ps1", "--katas", "softmax", "--force", cwd=round_trip)
    assert all(p.stat().st_mtime_ns > before[p] for p in records)   # every notebook graded again
