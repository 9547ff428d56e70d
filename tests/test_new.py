"""`kata new`: every file of a new kata in its place, a working kata that `kata lint` passes once the
places marked TODO(kata new) are written (here, by filling each with words), in a copy of the kit."""
import re
import shutil
import subprocess
import sys

import pytest

from graders.authoring.lint import MARKER
from graders.engine.manifest import ROOT, TRACKS, katas, parse


@pytest.fixture
def kit(tmp_path):
    """A copy of the kit's checkout, whose `kata` is run as `python -m cli` from it."""
    copy = tmp_path / "kit"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", ".venv", "build"))

    def kata(*args):
        return subprocess.run([sys.executable, "-c", "import cli; cli.main()", *args], cwd=copy, capture_output=True,
                              text=True, timeout=600, env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"})

    kata.root = copy
    return kata


def test_a_new_kata_is_written_in_place_and_linted_until_its_markers_are_filled(kit):
    made = kit("new", "new-example")
    assert made.returncode == 0, made.stderr
    written = re.findall(r"wrote (\S+)", made.stdout)
    assert {"katas/new-example/kata.toml", "katas/new-example/README.md", "katas/new-example/stub.py",
            "reference/new_example.py", "reference/new_example_bugs.py", "graders/new_example.py",
            "graders/new_example_hidden.py", "tests/test_kata_new_example.py", "README.md"} <= set(written)
    assert len([w for w in written if w.startswith("tests/zoo/new-example/")]) == 5
    order = max(k.order for k in katas()) + 1
    assert f"| {order} | `new-example` | PyTorch |" in (kit.root / "README.md").read_text()
    made_kata = parse(kit.root / "katas" / "new-example" / "kata.toml")   # a new kata comes after the others
    assert (made_kata.track, made_kata.difficulty) == (TRACKS[-1].name, "medium")

    linted = kit("lint", "new-example", "--seed", "1")
    problems = [line for line in linted.stdout.splitlines() if "✗" in line]
    assert linted.returncode == 1 and len(problems) == 2, linted.stdout
    assert f"markers: 40 `{MARKER}` marker(s) to fill in: katas/new-example/kata.toml:3" in problems[0]
    assert "kata-table: its row in the README's table of katas still says" in problems[1]

    for path in [kit.root / w for w in written]:
        path.write_text(path.read_text().replace(MARKER, "Written"))
    linted = kit("lint", "new-example", "--seed", "1")
    assert linted.returncode == 0, linted.stdout
    assert "oracle example-bug: failed" in linted.stdout and "reference: passed" in linted.stdout

    again = kit("new", "new-example")
    assert again.returncode == 2 and "new-example exists already: katas/new-example/kata.toml" in again.stderr


@pytest.mark.parametrize("slug, says", [("Softcap", "is not a kata slug"), ("soft_cap", "is not a kata slug"),
                                        ("softmax", "softmax exists already")])
def test_kata_new_refuses_a_bad_or_taken_slug(kit, slug, says):
    run = kit("new", slug)
    assert run.returncode == 2 and says in run.stderr
    assert not (kit.root / "katas" / slug / "stub.py").exists() or slug == "softmax"
