"""Nothing released gives an answer away: no function body of a kata's reference appears in its
stub, in any file `kata release` ships, or in a notebook `nbgrader generate_assignment` releases
from a `kata nbgrader init` course (the matcher: graders/authoring/leaks.py).
"""
import ast
import json
import subprocess
import sys

import pytest

from graders.authoring.leaks import functions, leaks
from graders.classroom import release
from graders.classroom.course import init
from graders.engine.manifest import find, katas


def assert_none(found: list[str]):
    assert not found, "answer code released:\n" + "\n".join(found)


@pytest.fixture(scope="module")
def notebooks(tmp_path_factory) -> dict[str, str]:
    """{released notebook: its code cells} of a course of every kata, released by the real nbgrader."""
    course = tmp_path_factory.mktemp("course")
    init(course, "ps1", katas())
    done = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", "ps1", "--force"], cwd=course,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    released = {}
    for path in sorted((course / "release" / "ps1").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        released[f"the released {path.name}"] = "\n".join("".join(c["source"]) for c in cells
                                                           if c["cell_type"] == "code")
    assert len(released) == len(katas())
    return released


def test_the_matcher_finds_a_renamed_copy_inside_a_larger_body():
    reference = ast.parse(find("rope").reference_path.read_text())
    body = next(body for name, body in functions(reference) if name == "apply_rope")
    renamed = "\n".join(map(ast.unparse, body)).replace("positions", "where").replace("x0", "even")
    source = "def judge(t, c, s, where):\n    first = 1\n" + "".join(f"    {line}\n" for line in renamed.splitlines())
    assert leaks({"a grader": source}) == ["rope: rope.py's apply_rope in a grader"]


def test_no_bundle_file_holds_reference_code(tmp_path):
    # Every file `kata release` ships, copied as it copies them: every kata in under a second, where
    # recording a bundle takes minutes, and the recordings it adds are data, not code.
    release._copy_kit(tmp_path, katas())
    shipped = {str(p.relative_to(tmp_path)): p.read_text() for p in sorted(tmp_path.rglob("*.py"))}
    assert_none(leaks(shipped))


def test_no_released_notebook_holds_reference_code(notebooks):
    assert_none(leaks(notebooks))
