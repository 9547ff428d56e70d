"""nbgrader courses: generated from the katas, autograded by the kit, scores in the gradebook.

``init`` writes a course directory: ``nbgrader_config.py`` and ``source/<assignment>/<kata>.ipynb``
per kata. Each notebook is generated from the kata's files: the README; a solution cell holding
the reference with every function body the stub leaves to the learner between ``### BEGIN
SOLUTION`` / ``### END SOLUTION`` (so ``nbgrader generate_assignment`` releases the stub's
signatures and docstrings and none of the reference's code); and one graded test cell per check,
with the check's points, the hidden ones between ``### BEGIN HIDDEN TESTS`` / ``### END HIDDEN
TESTS``.

``autograde`` grades ``submitted/<student>/<assignment>/<kata>.ipynb`` with the kit, not with
nbgrader's autograde: nbgrader would execute the learner's cells in the same kernel as the test
cells, where the learner's code can patch the checks. The kit reads the solution cells, grades
them in its sandbox (``kata grade``'s batch, resumable), and writes each check's score into the
grade of its test cell through nbgrader's gradebook API, so ``nbgrader export`` and the
formgrader show them.
"""
from __future__ import annotations

import ast
import json
import tempfile
import warnings
from pathlib import Path

from ..engine.manifest import Kata
from ..engine.plugin import check_names, hidden_grader
from ..practice.notebook import cell, document, marker, solution_source
from .batch import learners

CONFIG = '''c = get_config()  # noqa: F821  (nbgrader's config file)
c.CourseDirectory.course_id = {course!r}
c.CourseDirectory.db_url = "sqlite:///gradebook.db"
'''


def _nbgrader(grade_id: str, *, solution=False, grade=False, locked=False, points=None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


def _left_to_learner(stub: str) -> set[str]:
    """Qualified names of the stub's functions whose body raises NotImplementedError."""
    names = set()

    def visit(node, prefix=""):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if any(isinstance(n, ast.Raise) and "NotImplementedError" in ast.unparse(n) for n in ast.walk(child)):
                    names.add(prefix + child.name)

    visit(ast.parse(stub))
    return names


def solution_cell_source(kata: Kata) -> str:
    """The reference, each function body the stub leaves to the learner (after its docstring)
    between solution delimiters, indented like the body."""
    reference = kata.reference_path.read_text(encoding="utf-8")
    todo = _left_to_learner(kata.stub_path.read_text(encoding="utf-8"))
    lines = reference.splitlines()
    regions = []   # (first line, last line, indent), 1-based, inclusive

    def visit(node, prefix=""):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and prefix + child.name in todo:
                documented = ast.get_docstring(child) is not None
                body = child.body[1:] if documented else child.body
                if body:
                    first = min([body[0].lineno] + [d.lineno for d in getattr(body[0], "decorator_list", [])])
                    indent = lines[first - 1][: len(lines[first - 1]) - len(lines[first - 1].lstrip())]
                    # The comments above the first statement explain the solution: they go too.
                    above = child.body[0].end_lineno if documented else child.lineno
                    while first - 1 > above and lines[first - 2].strip().startswith("#"):
                        first -= 1
                    regions.append((first, child.end_lineno, indent))

    visit(ast.parse(reference))
    for first, last, indent in sorted(regions, reverse=True):
        lines[first - 1:last] = [f"{indent}### BEGIN SOLUTION", *lines[first - 1:last], f"{indent}### END SOLUTION"]
    return "\n".join(lines) + "\n"


def course_notebook(kata: Kata) -> dict:
    """The nbgrader source notebook of ``kata``."""
    hidden = check_names(hidden_grader(kata)) if hidden_grader(kata).exists() else {}
    names = {**check_names(kata.grader_path), **hidden}
    cells = [cell("markdown", f"{kata.slug}-task", kata.readme_path.read_text(encoding="utf-8")),
             cell("code", f"{kata.slug}-solution", marker(kata) + "\n" + solution_cell_source(kata),
                  _nbgrader(f"{kata.slug}-solution", solution=True))]
    for cid, points in kata.checks.items():
        call = (f"# {names.get(cid, cid)} ({points:g} point(s)): graded by the kit, in its sandbox.\n"
                f"from graders.practice.notebook import check_cell\ncheck_cell({kata.slug!r}, {cid!r})")
        source = f"### BEGIN HIDDEN TESTS\n{call}\n### END HIDDEN TESTS" if cid in hidden else call
        cells.append(cell("code", f"{kata.slug}-{cid}", source,
                          _nbgrader(f"{kata.slug}-{cid}", grade=True, locked=True, points=points)))
    return document(cells)


def init(course: Path, assignment: str, katas: list[Kata]):
    """Write the course directory; refuses to overwrite a notebook or a config already there."""
    source = course / "source" / assignment
    targets = [source / f"{k.module}.ipynb" for k in katas]
    config = course / "nbgrader_config.py"
    taken = [p for p in [*targets, config] if p.exists()]
    if taken:
        raise FileExistsError(f"{', '.join(map(str, taken))} already exist(s): they may hold your edits, "
                              "so nothing was written. Choose another course folder or assignment.")
    source.mkdir(parents=True, exist_ok=True)
    config.write_text(CONFIG.format(course=course.resolve().name), encoding="utf-8")
    for kata, target in zip(katas, targets):
        target.write_text(json.dumps(course_notebook(kata), indent=1) + "\n", encoding="utf-8")
    return targets


def submissions(course: Path, assignment: str, katas: list[Kata]) -> dict[str, dict[str, Path]]:
    """student -> {kata slug: submitted notebook}."""
    root = course / "submitted"
    found = {}
    # Students are the folders a class run accepts as learners (no links, printable names).
    for name in learners(root) if root.is_dir() else []:
        folder = root / name / assignment
        if folder.is_dir():
            found[name] = {k.slug: folder / f"{k.module}.ipynb" for k in katas
                                   if (folder / f"{k.module}.ipynb").is_file()}
    return found


def autograde(course: Path, assignment: str, katas: list[Kata], *, jobs: int, sandbox: bool = True,
              progress=lambda pair, result: None):
    """Grade the submitted notebooks with the kit and write the scores into nbgrader's gradebook."""
    from nbgrader.api import Gradebook, MissingEntry

    from .batch import Grading

    found = submissions(course, assignment, katas)
    if not found:
        raise LookupError(f"no submissions in {course / 'submitted'}/<student>/{assignment}/.")
    out = course / "kata" / assignment   # the kit's records, feedback.md and results per student
    refused = {}   # (student, slug) -> why the notebook was not graded
    with tempfile.TemporaryDirectory(prefix="kata-nbgrader-") as tmp:
        subs = Path(tmp)
        for student, notebooks in found.items():
            (subs / student).mkdir()
            for kata in katas:
                try:
                    source = solution_source(notebooks[kata.slug]) if kata.slug in notebooks else None
                except ValueError as exc:   # unreadable, or no solution cell left: refused with the reason
                    refused[student, kata.slug] = f"Your notebook was not graded: {exc}"
                    source = None
                if source is not None:
                    (subs / student / kata.learner_file).write_text(source, encoding="utf-8")
        run = Grading(subs, out, katas, jobs=jobs, force=False, seed=None, device="cpu",
                      show_hidden_diagnoses=False, sandbox=sandbox, refused=refused)
        run.run(run.todo(), progress)
        run.write_class_files()
        results = run.results()
    with warnings.catch_warnings(), Gradebook(f"sqlite:///{(course / 'gradebook.db').resolve()}") as gb:
        warnings.filterwarnings("ignore", module="nbgrader")   # its SQLAlchemy models warn on first use
        for student, by_kata in results.items():
            gb.update_or_create_student(student)
            try:
                gb.find_submission(assignment, student)
            except MissingEntry:
                gb.add_submission(assignment, student)
            for kata in katas:
                result = by_kata.get(kata.slug)
                scores = {c["id"]: c["score"] for c in result["checks"]} if result else {}
                for cid in kata.checks:
                    grade = gb.find_grade(f"{kata.slug}-{cid}", kata.module, assignment, student)
                    grade.auto_score = scores.get(cid, 0.0)
        gb.db.commit()
    return results
