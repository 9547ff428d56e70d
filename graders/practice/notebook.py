"""Katas in Jupyter: a self-study notebook per kata, and grading the solution cells of a notebook.

A kata's notebook is generated from its files, never kept by hand: the README as markdown, the
stub as the solution cell, and a check cell. The solution cell is tagged ``kata-solution`` and
starts with a marker line, so the check cell finds the code the kernel last ran for it (no need
to save the notebook first) and ``kata check KATA --file x.ipynb`` finds it in the saved file.
Grading is the kit's usual run: the learner's code goes to the sandbox, never into the check.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from ..engine.manifest import Kata
from ..engine.untrusted import TooLarge, encodable, read_capped
from .workspace import Workspace

SOLUTION_TAG = "kata-solution"
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
    check = (f"Run the cell below to grade the solution cell as `kata check {kata.slug}` would, in the "
             "kit's sandbox. Run the solution cell first: the check grades what the kernel last ran there.")
    return document([
        cell("markdown", f"{kata.slug}-0", kata.readme_path.read_text(encoding="utf-8")),
        cell("code", f"{kata.slug}-1", stub_cell(kata), {"tags": [SOLUTION_TAG]}),
        cell("markdown", f"{kata.slug}-2", check),
        cell("code", f"{kata.slug}-3", f"from graders.practice.notebook import check\ncheck({kata.slug!r})")])


def _text(source) -> str:
    return "".join(source) if isinstance(source, list) else str(source)


def _is_solution(cell: dict) -> bool:
    meta = cell.get("metadata") or {}
    return (SOLUTION_TAG in (meta.get("tags") or []) or bool((meta.get("nbgrader") or {}).get("solution"))
            or "### BEGIN SOLUTION" in _text(cell.get("source", "")))


def solution_source(path: Path) -> str:
    """The code of a notebook's solution cells (tagged ``kata-solution``, or nbgrader solution
    cells), joined in order; IPython magics and shell lines become comments. Raises TooLarge,
    unread, for a notebook over MAX_NOTEBOOK_BYTES."""
    try:
        nb = json.loads(read_capped(Path(path), MAX_NOTEBOOK_BYTES).decode("utf-8"))
        cells = [c for c in nb["cells"] if c.get("cell_type") == "code" and _is_solution(c)]
        # JSON can hold a lone surrogate ("\ud800"), which no file can: the code is written to one.
        code = encodable("\n\n".join(_plain_python(_text(c["source"])) for c in cells) + "\n")
    except TooLarge:
        raise
    # A learner's notebook can be any JSON: malformed metadata or nesting refuses this notebook only.
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise ValueError(f"{Path(path).name} is not a readable notebook ({type(exc).__name__}: "
                         f"{str(exc)[:200]}).") from None
    if not cells:
        raise ValueError(f"{path} has no solution cell: tag the cell holding your code `{SOLUTION_TAG}`.")
    return code


def _plain_python(source: str) -> str:
    return "\n".join(f"# {line}" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def grade_notebook(kata: Kata, path: Path, **options) -> dict:
    """Grade the solution cells of the notebook at ``path`` like a learner file."""
    from ..engine.runner import grade

    source = solution_source(path)
    with tempfile.TemporaryDirectory(prefix="kata-notebook-") as tmp:
        file = Path(tmp) / kata.learner_file
        file.write_text(source, encoding="utf-8")
        result = grade(kata, file, **options)
    return {**result, "file": str(Path(path).resolve())}


_graded = {}   # (slug, source) -> result: the test cells of one notebook share one grading


def _last_source(kata: Kata) -> str | None:
    """The code the kernel last ran in ``kata``'s solution cell, as a Python file (None: it never ran)."""
    from IPython import get_ipython

    ran = [cell for cell in get_ipython().user_ns.get("In", []) if cell.lstrip().startswith(marker(kata))]
    return _plain_python(ran[-1]) + "\n" if ran else None


def _grade_last_run(kata: Kata, seed: int | None) -> dict | None:
    """Grade the code the kernel last ran in ``kata``'s solution cell (None: it never ran)."""
    from ..engine.bundle import bundle_info
    from ..engine.runner import grade

    source = _last_source(kata)
    if source is None:
        print(f"Run the solution cell first (the one starting with `{marker(kata)}`), then this one.")
        return None
    bundle = bundle_info()
    seed = bundle["seed"] if seed is None and bundle else seed   # a student bundle checks at its seed
    key = (kata.slug, source, seed)
    if key not in _graded:
        with tempfile.TemporaryDirectory(prefix="kata-notebook-") as tmp:
            file = Path(tmp) / kata.learner_file
            file.write_text(source, encoding="utf-8")
            _graded[key] = {**grade(kata, file, seed=seed, hidden_seed=seed, device="auto"), "file": "this notebook"}
    return _graded[key]


def check(slug: str, *, seed: int | None = None):
    """The check cell: grade the code the kernel last ran in this kata's solution cell, in the
    kit's sandbox, and print the report."""
    from ..engine import manifest
    from ..engine.report import render

    kata = manifest.find(slug)
    result = _grade_last_run(kata, seed)
    if result is not None:
        print(render(result, kata, replay_with=f"check({slug!r}, seed={result['seed']}) in this cell"))
        # The kata's own run, as `kata check` records it: in the workspace the kernel runs in.
        problem = Workspace(os.environ.get("KATA_WORKSPACE") or ".").record_result(
            kata, result, source=_last_source(kata).encode("utf-8"))
        if problem:
            print(f"warning: {problem}")


def check_cell(slug: str, check_id: str, *, seed: int | None = None):
    """An nbgrader test cell: print one check's report; fail (AssertionError) if it did not pass."""
    from ..engine import manifest
    from ..engine.report import check_lines

    kata = manifest.find(slug)
    result = _grade_last_run(kata, seed)
    if result is None:
        raise AssertionError("the solution cell has not been run")
    check = next(c for c in result["checks"] if c["id"] == check_id)
    print("\n".join(check_lines(check, kata)))
    if check["status"] not in ("passed", "skipped"):
        raise AssertionError(f"{check_id} did not pass")
