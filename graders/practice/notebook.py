"""Katas in Jupyter: a self-study notebook per kata, and grading a notebook as nbgrader runs it.

A kata's notebook is generated from its files, never kept by hand: the README as markdown, the
stub as the solution cell, and a check cell. The solution cell is tagged ``kata-solution`` (an
nbgrader course's carries nbgrader's solution metadata); the check cell ``kata-check``.

What is graded is what nbgrader would run: the learner's code cells in order, the solution cell
among them, so a helper or an import in a cell of its own counts; the test cells and the kit's
check cells are left out (they grade the code, they are not part of it). A cell is found by its
metadata, never by a comment line a learner may paste over. The check and test cells grade the
saved notebook, as `kata check --file`, `kata grade`, nbgrader and Gradescope will, and say so
when the kernel ran code the saved file lacks. Grading is the kit's usual run: the learner's
code goes to the sandbox, never into the check.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..engine.manifest import Kata
from ..engine.untrusted import TooLarge, encodable, read_capped
from .workspace import Workspace

SOLUTION_TAG = "kata-solution"
CHECK_TAG = "kata-check"
KIT_IMPORT = "from graders.practice.notebook import"   # how the kit's check and test cells begin
MAX_NOTEBOOK_BYTES = 32 << 20   # a notebook keeps its outputs (plots, as base64) beside the code


def marker(kata: Kata) -> str:
    return f"# kata solution: {kata.slug} (your code goes in this cell; `kata check` grades it)"


def stub_cell(kata: Kata) -> str:
    """A solution cell as the learner starts it: the marker line, then the stub."""
    return marker(kata) + "\n" + kata.stub_path.read_text(encoding="utf-8").rstrip("\n")


def cell(kind: str, cell_id: str, source: str, metadata: dict | None = None) -> dict:
    """An nbformat 4 cell ("markdown" or "code")."""
    made = {"cell_type": kind, "id": cell_id, "metadata": metadata or {}, "source": source}
    if kind == "code":
        made.update(execution_count=None, outputs=[])
    return made


def document(cells: list[dict]) -> dict:
    """An nbformat 4.5 notebook of ``cells`` for a Python 3 kernel."""
    return {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                         "language_info": {"name": "python"}}}


def notebook(kata: Kata) -> dict:
    """The self-study notebook of ``kata`` (nbformat 4)."""
    check = (f"Run the cell below to grade this notebook as `kata check {kata.slug}` would, in the kit's "
             "sandbox: your code cells in order, from the saved file (save it first).")
    return document([
        cell("markdown", f"{kata.slug}-0", kata.readme_path.read_text(encoding="utf-8")),
        cell("code", f"{kata.slug}-1", stub_cell(kata), {"tags": [SOLUTION_TAG]}),
        cell("markdown", f"{kata.slug}-2", check),
        cell("code", f"{kata.slug}-3", f"{KIT_IMPORT} check\ncheck({kata.slug!r})", {"tags": [CHECK_TAG]})])


def _text(source) -> str:
    return "".join(source) if isinstance(source, list) else str(source)


def _is_solution(cell: dict) -> bool:
    meta = cell.get("metadata") or {}
    return (SOLUTION_TAG in (meta.get("tags") or []) or bool((meta.get("nbgrader") or {}).get("solution"))
            or "### BEGIN SOLUTION" in _text(cell.get("source", "")))


def _calls_the_kit(source: str) -> bool:
    """Whether a cell's code starts by importing the kit's checks: a check or test cell the kit wrote."""
    code = [line for line in source.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return bool(code) and code[0].startswith(KIT_IMPORT)


def _is_learners_code(cell: dict) -> bool:
    """A code cell nbgrader would run as part of the learner's work: not a test cell (nbgrader's
    graded cells that are not solutions), not the kit's check cell."""
    if cell.get("cell_type") != "code":
        return False
    if _is_solution(cell):
        return True
    meta = cell.get("metadata") or {}
    return not ((meta.get("nbgrader") or {}).get("grade") or CHECK_TAG in (meta.get("tags") or [])
                or _calls_the_kit(_text(cell.get("source", ""))))


@dataclass(frozen=True)
class Graded:
    """What of a notebook is graded: the learner's code cells, their positions (from 1, counted
    from the top as the notebook shows them) and code, in order."""
    cells: tuple[int, ...]
    sources: tuple[str, ...]

    @property
    def code(self) -> str:
        """The cells as one Python file, each after a comment naming it."""
        return "\n\n".join(f"# notebook cell {i}\n{source}" for i, source in zip(self.cells, self.sources)) + "\n"


def graded_cells(path: Path) -> Graded:
    """What of the notebook at ``path`` is graded (see ``Graded``); IPython magics and shell lines
    become comments. Raises TooLarge, unread, for a notebook over MAX_NOTEBOOK_BYTES, and
    ValueError, with the learner's sentence, for one that is not a notebook or has no solution cell."""
    path = Path(path)
    try:
        nb = json.loads(read_capped(path, MAX_NOTEBOOK_BYTES).decode("utf-8"))
        found = [(i, c) for i, c in enumerate(nb["cells"], 1) if _is_learners_code(c)]
        # JSON can hold a lone surrogate ("\ud800"), which no file can: the code is written to one.
        graded = Graded(tuple(i for i, _ in found),
                        tuple(encodable(_plain_python(_text(c["source"]))) for _, c in found))
        solved = any(_is_solution(c) for _, c in found)
    except TooLarge:
        raise
    # A learner's notebook can be any JSON: malformed metadata or nesting refuses this notebook only.
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise ValueError(f"{path.name} is not a readable notebook ({type(exc).__name__}: "
                         f"{str(exc)[:200]}).") from None
    if not solved:
        raise ValueError(f"{path} has no solution cell: tag the cell holding your code `{SOLUTION_TAG}`.")
    return graded


def solution_source(path: Path) -> str:
    """The code graded of the notebook at ``path`` (see ``graded_cells``)."""
    return graded_cells(path).code


def _plain_python(source: str) -> str:
    return "\n".join(f"# {line}" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def grade_notebook(kata: Kata, path: Path, **options) -> dict:
    """Grade the notebook at ``path`` as nbgrader runs it (see ``graded_cells``) like a learner file."""
    graded = graded_cells(path)
    return {**_grade_code(kata, graded.code, **options), "file": str(Path(path).resolve()), "cells": list(graded.cells)}


def _grade_code(kata: Kata, code: str, **options) -> dict:
    from ..engine.runner import grade

    with tempfile.TemporaryDirectory(prefix="kata-notebook-") as tmp:
        file = Path(tmp) / kata.learner_file
        file.write_text(code, encoding="utf-8")
        return grade(kata, file, **options)


_graded = {}   # (slug, code, seed) -> result: the test cells of one notebook share one grading


def _this_notebook(kata: Kata) -> Path | None:
    """The file of the notebook this kernel runs: the one Jupyter's session or VS Code names, else
    the kata's notebook in the kernel's folder (nbgrader validate and nbclient run there)."""
    from IPython import get_ipython

    names = get_ipython().user_ns
    for named in (names.get("__vsc_ipynb_file__"), names.get("__session__"), os.environ.get("JPY_SESSION_NAME")):
        if isinstance(named, str) and named.endswith(".ipynb"):
            # A Jupyter session names the notebook from the server's root; the kernel runs in its folder.
            for path in (Path(named), Path.cwd() / Path(named).name):
                if path.is_file():
                    return path
    path = Path.cwd() / f"{kata.module}.ipynb"
    return path if path.is_file() else None


def _unsaved(graded: Graded) -> bool:
    """Whether the last cell of the learner's this kernel ran is no cell of the saved notebook:
    the learner ran code they have not saved."""
    from IPython import get_ipython

    ran = [text for text in get_ipython().history_manager.input_hist_raw[1:-1]   # this cell is the last
           if text.strip() and not _calls_the_kit(text)]
    return bool(ran) and _plain_python(ran[-1]).strip() not in {source.strip() for source in graded.sources}


def _grade_this_notebook(kata: Kata, seed: int | None) -> tuple[Graded, dict]:
    """Grade the saved file of the notebook this kernel runs; raises LookupError, with the
    learner's sentence, where there is none to grade."""
    from ..engine.bundle import bundle_info

    path = _this_notebook(kata)
    if path is None:
        raise LookupError(f"The kit grades the saved notebook and found none: save this notebook as "
                          f"{kata.module}.ipynb in {Path.cwd()}, or run `kata check {kata.slug} --file NOTEBOOK`.")
    try:
        graded = graded_cells(path)
    except (ValueError, TooLarge) as exc:
        raise LookupError(str(exc)) from None
    if _unsaved(graded):
        print(f"Note: this kernel ran code that {path.name} does not hold yet: it is not saved. Graded here is the "
              "saved file, as your grade will be: save the notebook (Ctrl-S) and run this cell again.\n")
    bundle = bundle_info()
    seed = bundle["seed"] if seed is None and bundle else seed   # a student bundle checks at its seed
    key = (kata.slug, graded.code, seed)
    if key not in _graded:
        _graded[key] = {**_grade_code(kata, graded.code, seed=seed, hidden_seed=seed, device="auto"),
                        "file": path.name, "cells": list(graded.cells)}
    return graded, _graded[key]


def check(slug: str, *, seed: int | None = None):
    """The check cell: grade this notebook's saved file as nbgrader runs it, in the kit's sandbox,
    and print the report."""
    from ..engine import manifest
    from ..engine.report import render

    kata = manifest.find(slug)
    try:
        graded, result = _grade_this_notebook(kata, seed)
    except LookupError as exc:
        print(exc)
        return
    print(render(result, kata, replay_with=f"check({slug!r}, seed={result['seed']}) in this cell"))
    # The kata's own run, as `kata check` records it: in the workspace the kernel runs in.
    problem = Workspace(os.environ.get("KATA_WORKSPACE") or ".").record_result(
        kata, result, source=graded.code.encode("utf-8"))
    if problem:
        print(f"warning: {problem}")


def check_cell(slug: str, check_id: str, *, seed: int | None = None):
    """An nbgrader test cell: print one check's report; fail (AssertionError) if it did not pass."""
    from ..engine import manifest
    from ..engine.report import check_lines

    kata = manifest.find(slug)
    try:
        _, result = _grade_this_notebook(kata, seed)
    except LookupError as exc:
        raise AssertionError(str(exc)) from None
    check = next(c for c in result["checks"] if c["id"] == check_id)
    print("\n".join(check_lines(check, kata)))
    if check["status"] not in ("passed", "skipped"):
        raise AssertionError(f"{check_id} did not pass")
