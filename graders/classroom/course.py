"""nbgrader courses: generated from the katas, autograded by the kit, scores in the gradebook.

``init`` writes a course directory: ``nbgrader_config.py`` and ``source/<assignment>/<kata>.ipynb``
per kata. Each notebook is generated from the kata's files: the README; a solution cell holding
the whole reference between ``### BEGIN SOLUTION`` / ``### END SOLUTION``; and one graded test
cell per check, with the check's points, the hidden ones between ``### BEGIN HIDDEN TESTS`` /
``### END HIDDEN TESTS``. The config installs ``nbgrader_release.KataSolutions``, so that
``nbgrader generate_assignment`` releases the solution cell as the kata's stub, what ``kata
start`` gives; a stock nbgrader, without the config, releases its own code stub there. Either way
no answer is released.

``autograde`` grades ``submitted/<student>/<assignment>/<kata>.ipynb`` with the kit, not with
nbgrader's autograde: nbgrader would execute the learner's cells in the same kernel as the test
cells, where the learner's code can patch the checks. The kit takes the learner's code cells in
order, as nbgrader runs them (``practice.notebook``), grades them in its sandbox (``kata grade``'s
batch, resumable), and writes each check's score into the grade of its test cell through
nbgrader's gradebook API, so ``nbgrader export`` and the formgrader show them.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import warnings
from pathlib import Path

from ..engine.manifest import Kata
from ..engine.plugin import check_names
from ..engine.report import graded_cells
from ..engine.untrusted import read_capped, too_large
from ..practice.notebook import MAX_NOTEBOOK_BYTES, cell, document, marker, solution_source
from . import rules
from .batch import TIMESTAMP, learner_folders, linked_out, submission_file

CONFIG = '''c = get_config()  # noqa: F821  (nbgrader's config file)
c.CourseDirectory.course_id = {course!r}
c.CourseDirectory.db_url = "sqlite:///gradebook.db"

# A kata's solution cell is released as the kata's stub: the source cell holds the whole reference.
from graders.classroom.nbgrader_release import KataCollect, preprocessors  # noqa: E402
c.GenerateAssignment.preprocessors = preprocessors()
# nbgrader collect copies a link as a link (its own copy follows it): autograde refuses it.
c.ExchangeFactory.collect = KataCollect
'''


COURSE_KATAS = '''# The course's own katas (`kata --katas-dir`), for nbgrader's commands that load the kit.
import os  # noqa: E402
os.environ.setdefault("KATA_KATAS_DIR", {dirs!r})

'''


def _nbgrader(grade_id: str, *, solution=False, grade=False, locked=False, points=None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


def solution_id(kata: Kata) -> str:
    """The grade id of the kata's solution cell."""
    return f"{kata.slug}-solution"


def solution_cell_source(kata: Kata) -> str:
    """The source notebook's solution cell: the marker line, then the whole reference between
    solution delimiters."""
    reference = kata.reference_path.read_text(encoding="utf-8").rstrip()
    return f"{marker(kata)}\n### BEGIN SOLUTION\n{reference}\n### END SOLUTION\n"


def course_notebook(kata: Kata) -> dict:
    """The nbgrader source notebook of ``kata``."""
    hidden = check_names(kata.files["hidden"]) if kata.files["hidden"].exists() else {}
    names = {**check_names(kata.grader_path), **hidden}
    cells = [cell("markdown", f"{kata.slug}-task", kata.readme_path.read_text(encoding="utf-8")),
             cell("code", solution_id(kata), solution_cell_source(kata), _nbgrader(solution_id(kata), solution=True))]
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
    text = CONFIG.format(course=course.resolve().name)
    own = sorted({str(k.dir.parent) for k in katas if k.folder})
    if own:   # nbgrader's commands load the kit through this file: they find the course's own katas so
        text = COURSE_KATAS.format(dirs=os.pathsep.join(own)) + text
    config.write_text(text, encoding="utf-8")
    for kata, target in zip(katas, targets):
        target.write_text(json.dumps(course_notebook(kata), indent=1) + "\n", encoding="utf-8")
    return targets


def submissions(course: Path, assignment: str,
                katas: list[Kata]) -> tuple[dict[str, dict[str, Path]], dict[str, str]]:
    """student -> {kata slug: submitted notebook}, and the folders of submitted/ refused as
    students (a printable name -> why)."""
    root = course / "submitted"
    if not root.is_dir():
        return {}, {}
    # Students are the folders a class run accepts as learners (no links, printable names).
    students, refused = learner_folders(root)
    found = {}
    for name in students:
        folder = root / name / assignment
        if folder.is_dir():
            found[name] = {k.slug: folder / f"{k.module}.ipynb" for k in katas
                                   if (folder / f"{k.module}.ipynb").is_file()}
    return found, refused


def _copy_graded(notebook: Path, student: Path, to: Path) -> str:
    """Copy a submitted notebook in ``student``'s folder to ``to``, where it is graded, and return
    the code graded. Raises ValueError with the sentence the learner reads when it is not graded."""
    # A link (of the notebook or its folder) could lead to source/, where the reference is.
    refused = linked_out(notebook, student) or too_large(notebook, MAX_NOTEBOOK_BYTES)
    if refused is not None:
        raise ValueError(refused)
    to.write_bytes(read_capped(notebook, MAX_NOTEBOOK_BYTES))
    try:
        return solution_source(to)
    except ValueError as exc:   # unreadable, or no solution cell left
        to.unlink()
        raise ValueError(f"Your notebook was not graded: {str(exc).replace(str(to), notebook.name)}") from None


SUBMISSION_FILES = (TIMESTAMP, "submission_secret.txt")   # what nbgrader submit writes beside the notebooks


def _timestamp(text: str | None):
    """A submission's time as nbgrader reads timestamp.txt; None where there is none to read."""
    from nbgrader.utils import parse_utc

    text = (text or "").strip()
    try:
        return parse_utc(text) if text else None
    except (ValueError, OverflowError):
        return None


def nbgrader_config(course: Path):
    """The nbgrader configuration as nbgrader's commands load it in ``course``: the Jupyter config
    folders' nbgrader_config.py (the user's above the system's), then the course's."""
    from jupyter_core.paths import jupyter_config_path
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    config = Config()
    for folder in [*reversed(jupyter_config_path()), str(course)]:
        if (Path(folder) / "nbgrader_config.py").is_file():
            config.merge(PyFileConfigLoader("nbgrader_config.py", path=folder).load_config())
    return config


def _stream(text: str) -> list[dict]:
    return [{"output_type": "stream", "name": "stdout", "text": text.rstrip("\n") + "\n"}] if text.strip() else []


def autograded_notebook(kata: Kata, source: str | None, result: dict | None, policy) -> dict:
    """The notebook nbgrader keeps in autograded/ (read by ``generate_feedback`` and the
    formgrader): the source notebook with the code graded in the solution cell, never the
    reference, and each test cell's output what the learner may read of its check (as in
    feedback.md: hidden checks say only that they failed)."""
    from .batch import _check_text, _num, _override_text

    notebook = course_notebook(kata)
    checks = {c["id"]: c for c in (result or {}).get("checks", [])}
    if result is None or result["status"] == "missing":
        said = f"No {kata.module}.ipynb was submitted."
    else:
        said = "\n".join([f"{kata.slug}: {_num(result['score'])}/{_num(result['max_score'])} ({result['status']})",
                          *([graded_cells(result)] if result.get("cells") else []),
                          *([_override_text(result)] if result.get("override") else []),
                          *([result["checks"][0]["message"]]
                            if result["status"] in ("error", "empty") and result["checks"] else [])])
    for nb_cell in notebook["cells"]:
        grade_id = nb_cell["metadata"].get("nbgrader", {}).get("grade_id", "")
        if grade_id == solution_id(kata):
            nb_cell["source"] = f"{marker(kata)}\n" if source is None else source
            nb_cell["outputs"] = _stream(said)
        elif nb_cell["metadata"].get("nbgrader", {}).get("grade"):
            check = checks.get(grade_id.removeprefix(f"{kata.slug}-"))
            if check is not None and result["status"] not in ("error", "empty"):
                points = f"{_num(check['score'])}/{_num(check['max_score'])}"
                nb_cell["outputs"] = _stream(f"{check['status']} ({points})\n{_check_text(check, kata, policy)}")
    return notebook


@contextlib.contextmanager
def _graded_copies(course: Path, assignment: str, katas: list[Kata], *, jobs: int, sandbox: str,
                   policy: dict | None, force: bool):
    """The kit's grading of the submitted notebooks (a ``batch.Grading`` over copies of them in a
    folder that lasts as long as this context), and the code graded, (student, slug) -> source.
    ``policy`` None: the course's recorded rules, which must exist (a replay)."""
    from .batch import Grading

    found, refused_folders = submissions(course, assignment, katas)
    if not found:
        raise LookupError(f"no submissions in {course / 'submitted'}/<student>/{assignment}/.")
    out = course / "kata" / assignment   # the kit's records, feedback.md and results per student
    refused = {}   # (student, slug) -> why the notebook was not graded
    sources = {}   # (student, slug) -> the code graded
    with tempfile.TemporaryDirectory(prefix="kata-nbgrader-") as tmp:
        subs = Path(tmp)
        for student, notebooks in found.items():
            (subs / student).mkdir()
            for kata in katas:
                if kata.slug not in notebooks:
                    continue
                try:
                    sources[student, kata.slug] = _copy_graded(notebooks[kata.slug], course / "submitted" / student,
                                                               subs / student / f"{kata.module}.ipynb")
                except ValueError as exc:
                    refused[student, kata.slug] = str(exc)
        class_rules = rules.load_or_create(out, **policy) if policy is not None else rules.load(out)
        if class_rules is None:
            raise LookupError(f"{out} holds no graded course to replay (no {rules.CLASS_FILE}).")
        yield Grading(subs, out, katas, jobs=jobs, force=force, rules=class_rules, device="cpu", sandbox=sandbox,
                      refused=refused, refused_folders=refused_folders), sources


def replay(course: Path, assignment: str, katas: list[Kata], *, jobs: int, sandbox: str = "bwrap") -> list:
    """Grade the submitted notebooks again at the course's seeds, saving nothing, and compare each
    with its record (``batch.Grading.replay``)."""
    with _graded_copies(course, assignment, katas, jobs=jobs, sandbox=sandbox, policy=None, force=False) as (run, _):
        return run.replay()


def _manual_scores(gb, assignment: str, katas: list[Kata], results: dict) -> dict:
    """(student, slug) -> batch.Override, for a kata where a grader set a manual score on a test
    cell in nbgrader's formgrader: the kata's score as nbgrader counts it (each cell's manual score,
    else the kit's), so that the course's own grades.csv says what `nbgrader export` says."""
    from nbgrader.api import MissingEntry

    from .batch import Override

    found = {}
    for student, by_kata in results.items():
        for kata in katas:
            if kata.slug not in by_kata:
                continue
            scores = {c["id"]: c["score"] for c in by_kata[kata.slug]["checks"]}
            manual = {}
            for cid in kata.checks:
                try:
                    grade = gb.find_grade(f"{kata.slug}-{cid}", kata.module, assignment, student)
                except MissingEntry:
                    continue
                if grade.manual_score is not None:
                    manual[cid] = grade.manual_score
            if manual:
                score = round(sum(manual.get(cid, scores.get(cid, 0.0)) for cid in kata.checks), 6)
                found[student, kata.slug] = Override(score, "a grader's score in nbgrader's formgrader, for "
                                                            + ", ".join(f"`{cid}`" for cid in manual))
    return found


def autograde(course: Path, assignment: str, katas: list[Kata], *, jobs: int, sandbox: str = "bwrap",
              policy: dict | None = None, force: bool = False, progress=lambda pair, result: None):
    """Grade the submitted notebooks with the kit and do in nbgrader's gradebook and folders what
    nbgrader's autograde does: scores (no cell left for manual grading), submission times and late
    penalties as the course's config computes them, and the notebooks of autograded/. The kit's
    own class files count a grader's manual scores from the formgrader as nbgrader does (an
    override of OUT/overrides.csv comes first). ``policy``: the class's policy flags (see
    ``rules``), kept with the course's records; ``force``: grade again what is graded already."""
    policy = policy or {}
    import nbformat
    from nbgrader.api import Gradebook
    from nbgrader.preprocessors import AssignLatePenalties

    db_url = f"sqlite:///{(course / 'gradebook.db').resolve()}"
    with _graded_copies(course, assignment, katas, jobs=jobs, sandbox=sandbox, policy=policy,
                        force=force) as (run, sources):
        run.run(run.todo(), progress)
        graded = run.results()
        submitted = {student: {name: submission_file(course / "submitted" / student / assignment, name)
                               for name in SUBMISSION_FILES} for student in graded}
        with warnings.catch_warnings(), Gradebook(db_url) as gb:
            warnings.filterwarnings("ignore", module="nbgrader")   # its SQLAlchemy models warn on first use
            for student, by_kata in graded.items():
                gb.update_or_create_student(student)
                timestamp = _timestamp(submitted[student]["timestamp.txt"])
                gb.update_or_create_submission(assignment, student, **({"timestamp": timestamp} if timestamp else {}))
                for kata in katas:
                    result = by_kata.get(kata.slug)
                    scores = {c["id"]: c["score"] for c in result["checks"]} if result else {}
                    for cid in kata.checks:
                        grade = gb.find_grade(f"{kata.slug}-{cid}", kata.module, assignment, student)
                        grade.auto_score = scores.get(cid, 0.0)
                        grade.needs_manual_grade = grade.manual_score is not None   # as nbgrader's autograde
            gb.db.commit()
            manual = _manual_scores(gb, assignment, katas, graded)
        run.overrides = {**manual, **run.overrides}
        run.write_class_files()
        results = run.results()
    late = AssignLatePenalties(config=nbgrader_config(course))
    for student, by_kata in results.items():
        folder = course / "autograded" / student / assignment
        for name, text in submitted[student].items():   # release_feedback reads them there
            if text is not None:
                rules.atomic_write(folder / name, text)
        for kata in katas:
            notebook = autograded_notebook(kata, sources.get((student, kata.slug)), by_kata.get(kata.slug),
                                           run.rules.policy)
            rules.atomic_write(folder / f"{kata.module}.ipynb", json.dumps(notebook, indent=1) + "\n")
            resources = {"nbgrader": {"notebook": kata.module, "assignment": assignment, "student": student,
                                      "db_url": db_url}}
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", module="nbgrader")
                late.preprocess(nbformat.from_dict(notebook), resources)
    return results
