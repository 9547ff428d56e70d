"""An exercise of an instructor's own (docs/teaching.md, "An exercise of your own"), written from
that section alone: `kata new --katas-dir`, then the section's files over what it wrote; then the
checks it promises, a class graded, a student bundle and an nbgrader course, each through the real
`kata` command and nbgrader."""
import csv
import json
import os
import re
import site
import subprocess
import sys
from pathlib import Path

import pytest

from graders.engine.manifest import ROOT

from conftest import KATA, needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.xdist_group("course-kata")]

FILES = ("kata.toml", "README.md", "stub.py", "reference.py", "bugs.py", "grader.py", "hidden.py")
UNSCALED = "import numpy as np\n\n\ndef scores(q, k):\n    return np.einsum('...qd,...kd->...qk', q, k)\n"
LOOPS = ("import math\n\nimport numpy as np\n\n\ndef scores(q, k):\n    out = np.zeros(q.shape[:-1] + k.shape[-2:-1])\n"
         "    for i in np.ndindex(*out.shape):\n        *batch, a, b = i\n"
         "        out[i] = sum(x * y for x, y in zip(q[(*batch, a)], k[(*batch, b)])) / math.sqrt(q.shape[-1])\n"
         "    return out\n")
ENV = {**os.environ, "NO_COLOR": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def guide_files() -> dict[str, str]:
    """{file name: text} of each file the guide's section shows, as `qk-scores/<name>`: and a block."""
    section = (ROOT / "docs" / "teaching.md").read_text().split("## An exercise of your own\n")[1].split("\n## ")[0]
    return {name: body + "\n" for name, fence, body in
            re.findall(r"`qk-scores/([\w.]+)`:\n\n(`{3,4})\w*\n(.*?)\n\2\n", section, re.S)}


def kata(*args, katas_dir, cwd, env=None):
    return subprocess.run([str(KATA), "--katas-dir", str(katas_dir), *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={**ENV, **(env or {})}, timeout=600)


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """The course's folder of katas, as the guide has an instructor write it."""
    root = tmp_path_factory.mktemp("course")
    katas = root / "katas"
    katas.mkdir()
    done = subprocess.run([str(KATA), "new", "qk-scores", "--framework", "numpy", "--katas-dir", str(katas)],
                          capture_output=True, text=True, cwd=root, env=ENV, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (katas / "qk-scores").iterdir()) == sorted(FILES)
    shown = guide_files()
    assert sorted(shown) == sorted(FILES)   # the guide shows every file kata new wrote
    for name, text in shown.items():
        (katas / "qk-scores" / name).write_text(text)
    return root


def test_a_class_is_graded_on_it_as_the_guide_says(course, tmp_path):
    """The reference gets full marks, the stub is not started, the bug is named with the kit's
    explanation and the kata's own fix, another idiom of the answer passes, beside a kit's kata."""
    katas, folder = course / "katas", course / "katas" / "qk-scores"
    linted = kata("lint", "qk-scores", katas_dir=Path("katas"), cwd=course)
    assert linted.returncode == 0 and "0 problem(s)" in linted.stdout, linted.stdout
    subs, out = tmp_path / "subs", tmp_path / "out"
    handed = {"ada": (folder / "reference.py").read_text(), "ben": UNSCALED, "cy": (folder / "stub.py").read_text(),
              "dee": LOOPS}
    for learner, text in handed.items():
        (subs / learner).mkdir(parents=True)
        (subs / learner / "qk_scores.py").write_text(text)
    (subs / "ada" / "softmax.py").write_text((ROOT / "reference" / "softmax.py").read_text())
    done = kata("grade", subs, "--out", out, "--katas", "qk-scores,softmax", katas_dir=katas, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with open(out / "grades.csv", newline="") as f:
        rows = {r["learner"]: (r["qk-scores"], r["qk-scores status"], r["softmax"]) for r in csv.DictReader(f)}
    assert rows == {"ada": ("3", "passed", "10"), "ben": ("0", "failed", "0"), "cy": ("0", "not-started", "0"),
                    "dee": ("3", "passed", "0")}
    assert "| `no-scaling` | qk-scores | 1 |" in (out / "summary.md").read_text()
    # As the guide has the instructor try a wrong solution: the kit's explanation, the kata's own
    # fix, and a replay that finds the kata too.
    unscaled = kata("check", "qk-scores", "--file", subs / "ben" / "qk_scores.py", katas_dir=Path("katas"), cwd=course)
    assert "FAILED  0/3 points" in unscaled.stdout and "Diagnoses: no-scaling" in unscaled.stdout
    assert "Divide by `np.sqrt(q.shape[-1])`." in unscaled.stdout and "are not scaled" in unscaled.stdout
    assert f"kata --katas-dir {katas} check qk-scores" in unscaled.stdout


def test_its_student_bundle_holds_no_answer_and_checks_the_public_checks(course, tmp_path):
    bundle = tmp_path / "bundle"
    done = kata("release", "--out", bundle, "--katas", "qk-scores", katas_dir=course / "katas", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (bundle / "katas" / "qk-scores").iterdir()) == [
        "README.md", "grader.py", "kata.toml", "stub.py"]
    work = tmp_path / "work"
    work.mkdir()
    (work / "qk_scores.py").write_text(LOOPS)
    # The bundle alone, as a student installs it: no --katas-dir, no kit.
    boot = (f"import sys; sys.path[:0] = [{str(bundle)!r}]; sys.path += {site.getsitepackages()!r}; "
            "sys.argv[0] = 'kata'\nimport cli; cli.main()")
    env = {k: v for k, v in ENV.items() if k not in ("KATA_KATAS_DIR", "PYTHONPATH")}
    run = subprocess.run([sys.executable, "-I", "-S", "-c", boot, "check", "qk-scores"], capture_output=True,
                         text=True, cwd=work, env={**env, "KATA_WORKSPACE": str(work)}, timeout=300)
    assert run.returncode == 0 and "PASSED  2/2 points" in run.stdout, run.stdout + run.stderr
    assert "1 hidden check(s) run when your instructor grades" in run.stdout


def test_an_nbgrader_course_releases_and_autogrades_it(course, tmp_path):
    katas, nbgrader = course / "katas", (sys.executable, "-m", "nbgrader")
    done = kata("nbgrader", "init", tmp_path / "c", "--assignment", "ps1", "--katas", "qk-scores", katas_dir=katas,
                cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    env = {k: v for k, v in ENV.items() if k != "KATA_KATAS_DIR"}   # the course's config remembers the folder
    released = subprocess.run([*nbgrader, "generate_assignment", "ps1"], cwd=tmp_path / "c", env=env,
                              capture_output=True, text=True, timeout=300)
    assert released.returncode == 0, released.stderr
    notebook = json.loads((tmp_path / "c" / "release" / "ps1" / "qk_scores.ipynb").read_text())
    code = "".join("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code")
    assert "np.sqrt(q.shape[-1])" not in code   # the answer is not released
    for student, answer in {"ada": LOOPS, "ben": UNSCALED}.items():
        solution = next(c for c in notebook["cells"] if c["metadata"].get("nbgrader", {}).get("solution"))
        solution["source"] = answer
        folder = tmp_path / "c" / "submitted" / student / "ps1"
        folder.mkdir(parents=True)
        (folder / "qk_scores.ipynb").write_text(json.dumps(notebook))
    graded = subprocess.run([str(KATA), "nbgrader", "autograde", ".", "ps1"], cwd=tmp_path / "c", env=env,
                            capture_output=True, text=True, timeout=600)   # the config names the folder
    assert graded.returncode == 0 and graded.stdout.splitlines()[:2] == ["ada: 3/3", "ben: 0/3"], graded.stdout
    exported = subprocess.run([*nbgrader, "export"], cwd=tmp_path / "c", env=env, capture_output=True, text=True,
                              timeout=300)
    assert exported.returncode == 0, exported.stderr
    with open(tmp_path / "c" / "grades.csv", newline="") as f:
        assert {r["student_id"]: float(r["raw_score"]) for r in csv.DictReader(f)} == {"ada": 3.0, "ben": 0.0}


def test_the_gradescope_zip_carries_it_whole(course, monkeypatch):
    """What `kata --katas-dir DIR gradescope` adds to the zip (test_gradescope grades it there)."""
    from graders.classroom.gradescope import course_katas
    from graders.engine.manifest import find

    monkeypatch.setenv("KATA_KATAS_DIR", str(course / "katas"))
    zipped = course_katas([find("qk-scores"), find("softmax")])   # the kit's katas travel in its wheel
    assert sorted(zipped) == [f"katas/qk-scores/{name}" for name in sorted(FILES)]
