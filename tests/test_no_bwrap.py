"""Without bubblewrap on PATH: grading refuses to run (exit 2, the install command) unless told
--no-sandbox, which warns in every class file, and works as root wherever Python is installed;
self-study checks still work, with one note line."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from conftest import KATA
from graders.engine.manifest import ROOT

STUB = (ROOT / "katas" / "softmax" / "stub.py").read_text()


def run(*args, cwd, path_without_bwrap=True):
    env = {**os.environ, "NO_COLOR": "1", "KATA_WORKSPACE": str(cwd)}
    if path_without_bwrap:
        env["PATH"] = str(KATA.parent)   # the venv's scripts: no bwrap there
    return subprocess.run([str(KATA), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


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


@pytest.mark.skipif(os.geteuid() != 0, reason="a private Python matters only to root, whose sandbox user cannot read it")
def test_no_sandbox_grades_as_root_with_python_in_a_private_folder(tmp_path):
    """Python under a folder only root may enter (as under a private /root): the sandbox user
    could not import anything, so --no-sandbox runs learner code as root, and says so."""
    private = Path(tempfile.mkdtemp(prefix="kata-private-"))   # 0700, as /root is
    try:
        # The installation reached through the private folder (a link: nothing is copied), a
        # virtual environment in it, and this environment's packages (torch, the kit) in that.
        (private / "python").symlink_to(sys.base_prefix)
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        subprocess.run([str(private / "python" / "bin" / version), "-m", "venv", "--without-pip",
                        str(private / "venv")], check=True)
        packages = Path(sysconfig.get_paths(vars={"base": str(private / "venv")})["purelib"])
        packages.rmdir()
        packages.symlink_to(sysconfig.get_paths()["purelib"])
        python = private / "venv" / "bin" / "python"
        # The set-up is what it claims: the sandbox user cannot reach the standard library.
        assert subprocess.run(["ls", str(private / "python" / "lib" / version)], user=20000, group=20000,
                              extra_groups=[], capture_output=True).returncode != 0
        out = tmp_path / "out"
        env = {**os.environ, "NO_COLOR": "1", "PATH": str(python.parent)}
        done = subprocess.run([str(python), "-c", "import cli; cli.main()", "grade", str(a_class(tmp_path)),
                               "--out", str(out), "--katas", "softmax", "--no-sandbox"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
    finally:
        shutil.rmtree(private)
    assert done.returncode == 0, done.stderr
    assert "runs as root" in done.stderr
    record = json.loads((out / ".kata" / "records" / "ada" / "softmax.json").read_text())
    assert record["result"]["sandbox"] == "process" and record["result"]["status"] == "not-started"
    assert "--no-sandbox" in (out / "summary.md").read_text()
    assert "--no-sandbox" in json.loads((out / "ada" / "results.json").read_text())["output"]


def test_container_grades_nowhere_learner_code_could_read_the_kit(tmp_path):
    """--container is no way round the sandbox on a workstation: without bwrap it grades only as
    root, where the sandbox user can read neither the kit nor the class."""
    out = tmp_path / "out"
    done = run("grade", str(a_class(tmp_path)), "--out", str(out), "--katas", "softmax", "--container", cwd=tmp_path)
    assert done.returncode == 2 and "--container cannot grade in this container" in done.stderr, done.stderr
    if os.geteuid() == 0:   # this checkout is readable by all
        assert str(ROOT / "reference") in done.stderr
    else:
        assert "must run as root" in done.stderr
    assert not (out / "grades.csv").exists()
