"""The instructor's install (docs/teaching.md), a normal (not editable) install of the kit: every
instructor command works from it, `kata gradescope` included, whose wheel is then packed again
from the installed files."""
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from graders.classroom.gradescope import _checkout_wheel
from graders.engine.manifest import ROOT

from conftest import needs_bwrap

# One installation, made once: one worker runs them all.
pytestmark = [needs_bwrap, pytest.mark.xdist_group("install")]


@pytest.fixture(scope="module")
def install(tmp_path_factory):
    """A virtual environment holding the kit as pip installs its wheel, and this environment's
    other packages (torch, NumPy, nbgrader ...: links, nothing is copied), but not its editable
    install of this checkout."""
    base = tmp_path_factory.mktemp("install")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base / "venv")], check=True)
    packages = Path(sysconfig.get_paths(vars={"base": str(base / "venv")})["purelib"])
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("__editable__", "attention_katas")):
            (packages / entry.name).symlink_to(entry)
    wheel = _checkout_wheel(base, ROOT / "pyproject.toml")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(packages), str(wheel)],
                   check=True)
    return base / "venv" / "bin" / "python", packages, wheel


def kata(python: Path, *args, cwd: Path) -> subprocess.CompletedProcess:
    """The installed `kata` (pip's script runs `cli.main`, as this does), NO_COLOR, in ``cwd``."""
    env = {**os.environ, "NO_COLOR": "1", "PATH": f"{python.parent}:{os.environ['PATH']}"}
    return subprocess.run([str(python), "-c", "import cli; cli.main()", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_the_kit_runs_from_the_installed_copy(install):
    python, packages, _ = install
    where = subprocess.run([str(python), "-c", "import graders, reference; print(graders.__file__, reference.__file__)"],
                           capture_output=True, text=True, check=True, cwd="/").stdout.split()
    assert all(Path(p).is_relative_to(packages) for p in where), where


def test_kata_gradescope_packs_the_installed_kit_as_the_wheel_it_came_from(install, tmp_path):
    python, _, built = install
    done = kata(python, "gradescope", "--out", tmp_path / "autograder.zip", "--katas", "softmax", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    with zipfile.ZipFile(tmp_path / "autograder.zip") as zf:
        name, = (n for n in zf.namelist() if n.endswith(".whl"))
        assert name == built.name
        (tmp_path / name).write_bytes(zf.read(name))

    def files(wheel):
        with zipfile.ZipFile(wheel) as zf:
            return {n: zf.read(n) for n in zf.namelist() if not n.endswith(".dist-info/RECORD")}

    assert files(tmp_path / name) == files(built)   # every file, byte for byte
    with zipfile.ZipFile(tmp_path / name) as zf:   # and a RECORD that pip checks on install
        record = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))).decode()
    assert {line.split(",")[0] for line in record.splitlines()} == set(files(built)) | {
        next(n for n in files(built) if n.endswith("METADATA")).replace("METADATA", "RECORD")}
    target = tmp_path / "reinstalled"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                    str(tmp_path / name)], check=True)
    assert (target / "reference" / "softmax.py").read_bytes() == (ROOT / "reference" / "softmax.py").read_bytes()


def test_kata_gradescope_refuses_an_installed_kit_changed_since(install, tmp_path):
    python, packages, _ = install
    reference = packages / "reference" / "softmax.py"
    original = reference.read_bytes()
    reference.write_bytes(original + b"# changed\n")
    try:
        done = kata(python, "gradescope", "--out", tmp_path / "autograder.zip", cwd=tmp_path)
    finally:
        reference.write_bytes(original)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{reference} was changed since the kit was installed" in done.stderr
    assert not (tmp_path / "autograder.zip").exists()


def test_grade_release_and_an_nbgrader_course_work_from_the_install(install, tmp_path):
    python, _, _ = install
    subs = tmp_path / "subs"
    (subs / "ada").mkdir(parents=True)
    (subs / "ada" / "softmax.py").write_text((ROOT / "reference" / "softmax.py").read_text())
    done = kata(python, "grade", subs, "--out", tmp_path / "out", "--katas", "softmax", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "out" / "ada" / "results.json").read_text())["score"] == 10
    done = kata(python, "release", "--out", tmp_path / "bundle", "--katas", "softmax", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "bundle" / "reference").exists() and (tmp_path / "bundle" / "README.md").is_file()
    course = tmp_path / "course"
    done = kata(python, "nbgrader", "init", course, "--assignment", "ps1", "--katas", "softmax", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # nbgrader runs alembic's script, which pip put beside this environment's python
    env = {**os.environ, "PATH": f"{python.parent}:{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run([str(python), "-m", "nbgrader", "generate_assignment", "ps1"], cwd=course, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    released = (course / "release" / "ps1" / "softmax.ipynb").read_text()
    assert "raise NotImplementedError" in released   # the kit's own config ran: the stub is released


def test_without_triton_the_triton_katas_say_how_to_install_it_and_the_others_work(install, tmp_path):
    """The same install in an environment that lacks Triton (an optional extra): every Triton kata
    says how to install it, at `kata start` and at `kata check`, and every other kata works, in a
    `kata check` of all the started ones too."""
    _, packages, _ = install
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_paths(vars={"base": str(venv)})["purelib"])
    for entry in packages.iterdir():
        if not entry.name.startswith("triton"):
            (site / entry.name).symlink_to(entry)
    python = venv / "bin" / "python"
    assert subprocess.run([str(python), "-c", "import triton"], capture_output=True).returncode == 1
    ws = tmp_path / "ws"
    started = kata(python, "start", "triton-softmax", "-w", ws, cwd=tmp_path)
    assert started.returncode == 0 and "pip install 'attention-katas[triton]'" in started.stdout, started.stdout
    assert kata(python, "start", "softmax", "-w", ws, cwd=tmp_path).returncode == 0
    done = kata(python, "check", "triton-softmax", "-w", ws, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "triton-softmax is a Triton kata, and Triton is not installed here" in done.stderr
    assert "Every other kata works without it." in done.stderr
    done = kata(python, "check", "-w", ws, cwd=tmp_path)   # every started kata: softmax is graded
    assert "skipped: triton-softmax is a Triton kata" in done.stderr, done.stderr
    assert "NOT-STARTED" in done.stdout and "softmax" in done.stdout, done.stdout
