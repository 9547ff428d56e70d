"""Katas in Jupyter: `kata notebook`, its check cell run by a real kernel (nbclient), and
`kata check --file x.ipynb`."""
import json
import re

import pytest

from graders.engine.manifest import ROOT, find
from graders.practice.notebook import SOLUTION_TAG, solution_source


def run_notebook(path):
    import nbformat   # here, not at collection: the Jupyter stack takes most of a second
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    return re.sub(r"\x1b\[[0-9;]*m", "", "".join(o.get("text", "") for o in nb.cells[-1].outputs))


@pytest.fixture
def softmax_notebook(kata_cmd):
    run = kata_cmd("notebook", "softmax")
    assert run.returncode == 0, run.stderr
    return kata_cmd.workspace / "softmax.ipynb"


def test_the_notebook_runs_top_to_bottom_and_reports_not_started(softmax_notebook):
    nb = json.loads(softmax_notebook.read_text())
    assert find("softmax").readme_path.read_text() in "".join(nb["cells"][0]["source"])
    assert "NOT-STARTED  0/10 points" in run_notebook(softmax_notebook)


def test_the_check_cell_grades_what_the_kernel_ran(softmax_notebook):
    nb = json.loads(softmax_notebook.read_text())
    solution = next(c for c in nb["cells"] if SOLUTION_TAG in c["metadata"].get("tags", []))
    solution["source"] = solution["source"].split("\n")[0] + "\n" + find("softmax").reference_path.read_text()
    softmax_notebook.write_text(json.dumps(nb))
    assert "PASSED  10/10 points" in run_notebook(softmax_notebook)


def test_the_check_cell_names_its_replay_and_records_its_run(softmax_notebook):
    nb = json.loads(softmax_notebook.read_text())
    solution = next(c for c in nb["cells"] if SOLUTION_TAG in c["metadata"].get("tags", []))
    solution["source"] = solution["source"].split("\n")[0] + "\n" + \
        (ROOT / "tests" / "zoo" / "softmax" / "d2l__softmax-overflow.py").read_text()
    softmax_notebook.write_text(json.dumps(nb))
    shown = run_notebook(softmax_notebook)
    assert "FAILED" in shown and re.search(r"Replay exactly this run: check\('softmax', seed=\d+\) in this cell", shown)
    # Recorded as `kata check` records a run, in the notebook's folder (the kernel's).
    [entry] = [json.loads(line) for line in (softmax_notebook.parent / ".kata/history.jsonl").read_text().splitlines()]
    assert (entry["type"], entry["kata"], entry["status"]) == ("check", "softmax", "failed") and "scratch" not in entry


def test_kata_check_grades_a_saved_notebooks_solution_cells(softmax_notebook, kata_cmd):
    stub = kata_cmd("check", "softmax", "--file", "softmax.ipynb")
    assert stub.returncode == 1 and "NOT-STARTED" in stub.stdout
    nb = json.loads(softmax_notebook.read_text())
    solution = next(c for c in nb["cells"] if SOLUTION_TAG in c["metadata"].get("tags", []))
    solution["source"] = "%load_ext autoreload\n" + find("softmax").reference_path.read_text()   # a magic is fine
    softmax_notebook.write_text(json.dumps(nb))
    done = kata_cmd("check", "--file", "softmax.ipynb", "--json")
    result = json.loads(done.stdout)
    assert done.returncode == 0 and result["status"] == "passed" and result["file"] == str(softmax_notebook)


def test_a_notebook_without_a_solution_cell_is_a_usage_error(kata_cmd):
    path = kata_cmd.workspace / "softmax.ipynb"
    path.write_text(json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "source": "x = 1",
                                           "outputs": [], "execution_count": None}],
                                "nbformat": 4, "nbformat_minor": 5, "metadata": {}}))
    run = kata_cmd("check", "softmax", "--file", str(path))
    assert run.returncode == 2 and "has no solution cell" in run.stderr
    with pytest.raises(ValueError, match="has no solution cell"):
        solution_source(path)


def test_kata_notebook_never_overwrites_the_learners_notebook(softmax_notebook, kata_cmd):
    softmax_notebook.write_text("my work")
    again = kata_cmd("notebook", "softmax")
    assert again.returncode == 2 and "left alone" in again.stderr
    assert softmax_notebook.read_text() == "my work"


# --- the notebook graded as nbgrader runs it: the learner's code cells in order ----------------------

HELPER = ("import numpy as np\n\n\ndef shifted_exp(x, axis):\n"
          "    return np.exp(x - x.max(axis=axis, keepdims=True))\n")
USES_HELPER = ("def softmax(x, axis=-1):\n    e = shifted_exp(x, axis)\n"
               "    return e / e.sum(axis=axis, keepdims=True)\n")


def with_helper_cell(path, solution: str, *, keep_marker=True) -> dict:
    """The notebook at ``path`` with ``HELPER`` in a code cell of its own above the solution cell,
    the solution cell holding ``solution`` (after the kata's marker line, or pasted over it), and a
    scratch cell of the learner's after the check cell."""
    nb = json.loads(path.read_text())
    at, solution_cell = next((i, c) for i, c in enumerate(nb["cells"]) if SOLUTION_TAG in c["metadata"].get("tags", []))
    marker_line = solution_cell["source"].split("\n")[0] + "\n"
    solution_cell["source"] = (marker_line if keep_marker else "") + solution
    helper = {"cell_type": "code", "id": "helper", "metadata": {}, "source": HELPER, "outputs": [], "execution_count": None}
    scratch = {**helper, "id": "scratch", "source": "print(softmax(np.array([1.0, 2.0])).round(3))\n"}
    nb["cells"][at:at] = [helper]
    nb["cells"].append(scratch)
    return nb


def test_a_helper_in_the_learners_own_cell_counts_and_the_report_names_the_cells(softmax_notebook, kata_cmd):
    nb = with_helper_cell(softmax_notebook, USES_HELPER)
    softmax_notebook.write_text(json.dumps(nb))
    # cells: README, helper, solution, the check's text, the check cell, scratch
    assert [c["cell_type"] for c in nb["cells"]] == ["markdown", "code", "code", "markdown", "code", "code"]
    done = kata_cmd("check", "softmax", "--file", "softmax.ipynb")
    assert done.returncode == 0 and "PASSED  10/10 points" in done.stdout, done.stdout + done.stderr
    assert ("Graded: cells 2, 3 and 6 of softmax.ipynb, your code cells in order (the test and check cells "
            "left out).") in " ".join(done.stdout.split())
    code = solution_source(softmax_notebook)
    assert code.index("def shifted_exp") < code.index("def softmax") < code.index("print(softmax")
    assert "check(" not in code


def test_the_check_cell_grades_a_solution_pasted_over_its_first_line(softmax_notebook):
    """A learner who pastes over the whole solution cell loses the kit's comment line: the cell is
    still found by its tag, with the helper in its own cell."""
    nb = with_helper_cell(softmax_notebook, USES_HELPER, keep_marker=False)
    nb["cells"].pop()   # run_notebook reads the check cell's output: it comes last
    softmax_notebook.write_text(json.dumps(nb))
    shown = run_notebook(softmax_notebook)
    assert "PASSED  10/10 points" in shown, shown


def test_the_check_cell_says_when_the_kernel_ran_code_the_saved_file_lacks(softmax_notebook):
    """The check grades the saved notebook, as `kata check --file`, nbgrader and Gradescope will: a
    solution run but not saved is said, not silently graded as something else."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(softmax_notebook, as_version=4)
    solution = next(c for c in nb.cells if SOLUTION_TAG in c.metadata.get("tags", []))
    solution.source = find("softmax").reference_path.read_text()   # run, never saved
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(softmax_notebook.parent)}}).execute()
    shown = re.sub(r"\x1b\[[0-9;]*m", "", "".join(o.get("text", "") for o in nb.cells[-1].outputs))
    assert "NOT-STARTED" in shown and "not saved" in shown, shown
