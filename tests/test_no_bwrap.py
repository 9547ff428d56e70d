"""Without bubblewrap on PATH: grading refuses to run (exit 2, the install command) unless told
--no-sandbox, which warns in every class file; self-study checks still work, with one note line.
And a seed that a released student bundle recorded is refused for grading."""
import json
import os
import shutil
import subprocess

import pytest

from conftest import KATA
from graders.engine.manifest import ROOT

STUB = (ROOT / "katas" / "softmax" / "stub.py").read_text()


def run(*args, cwd, path_without_bwrap=True, home=None):
    env = {**os.environ, "NO_COLOR": "1", "KATA_WORKSPACE": str(cwd)}
    if path_without_bwrap:
        env["PATH"] = str(KATA.parent)   # the venv's scripts: no bwrap there
    if home is not None:
        env["XDG_STATE_HOME"] = str(home)
    return subprocess.run([str(KATA), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def python_for_others():
    """Whether --no-sandbox can drop to another user here: as root, that user must read Python."""
    from graders.engine.sandbox import SandboxUnusable, sandbox_uid

    try:
        sandbox_uid(isolated=False)
        return True
    except SandboxUnusable:
        return False


no_sandbox_possible = pytest.mark.skipif(not python_for_others(), reason="as root, --no-sandbox needs a Python "
                                         "that other users can read (.ci/run makes it so)")


def a_class(tmp_path):
    subs = tmp_path / "subs"
    (subs / "ada").mkdir(parents=True)
    (subs / "ada" / "softmax.py").write_text(STUB)
    return subs


def test_grade_refuses_to_run_without_bwrap(tmp_path):
    done = run("grade", str(a_class(tmp_path)), "--out", str(tmp_path / "out"), "--katas", "softmax", cwd=tmp_path)
    assert done.returncode == 2
    assert "apt-get install bubblewrap" in done.stderr and "--no-sandbox" in done.stderr
    assert not (tmp_path / "out" / "grades.csv").exists()


@no_sandbox_possible
def test_no_sandbox_grades_and_says_so_everywhere(tmp_path):
    out = tmp_path / "out"
    done = run("grade", str(a_class(tmp_path)), "--out", str(out), "--katas", "softmax", "--no-sandbox", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "--no-sandbox" in done.stderr
    assert "--no-sandbox" in (out / "summary.md").read_text()
    assert "--no-sandbox" in json.loads((out / "ada" / "results.json").read_text())["output"]
    record = json.loads((out / ".kata" / "records" / "ada" / "softmax.json").read_text())
    assert record["result"]["sandbox"] == "process"


def test_check_works_without_bwrap_with_one_note(tmp_path):
    (tmp_path / "softmax.py").write_text(STUB)
    done = run("check", "softmax", "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "not-started" and result["sandbox"] == "process"
    notes = [line for line in done.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "apt-get install bubblewrap" in notes[0]


def test_check_uses_bwrap_when_present(tmp_path):
    if shutil.which("bwrap") is None:
        return   # nothing to compare with here; CI installs bwrap
    (tmp_path / "softmax.py").write_text(STUB)
    done = run("check", "softmax", "--json", cwd=tmp_path, path_without_bwrap=False)
    assert json.loads(done.stdout)["sandbox"] == "bwrap" and "note:" not in done.stderr


@no_sandbox_possible
def test_grading_refuses_a_seed_a_bundle_recorded(tmp_path):
    state = tmp_path / "state"
    (state / "attention-katas").mkdir(parents=True)
    (state / "attention-katas" / "released-seeds.json").write_text("[1234]")
    subs = a_class(tmp_path)
    for seed in ("1234", "0"):   # the one released here, and the default release seed
        done = run("grade", str(subs), "--out", str(tmp_path / "out"), "--seed", seed, "--no-sandbox",
                   cwd=tmp_path, home=state)
        assert done.returncode == 2 and "answer key" in done.stderr, done.stderr
    done = run("grade", str(subs), "--out", str(tmp_path / "out"), "--katas", "softmax", "--seed", "1235",
               "--no-sandbox", cwd=tmp_path, home=state)
    assert done.returncode == 0, done.stderr
