"""`kata gradescope`: the real zip, unpacked into a temporary autograder root, its setup.sh run for
real (a virtual environment with torch and the kit's wheel, about 30 s, once per session), then its
run_autograder on submissions as Gradescope would run it."""
import json
import os
import shutil
import stat
import subprocess
import tempfile
import zipfile
from pathlib import Path

import pytest

from conftest import KATA, needs_bwrap
from graders.engine.manifest import find

# One autograder, built and set up once: one worker runs them all.
pytestmark = [needs_bwrap, pytest.mark.xdist_group("gradescope")]

KATAS = [find("softmax"), find("causal-mask")]
MAX_SCORE = sum(k.max_score for k in KATAS)

# Gradescope's documented results.json fields
# (https://gradescope-autograders.readthedocs.io/en/latest/specs/#output-format); strict, so that
# a misspelt field fails here rather than being ignored by Gradescope.
VISIBILITY = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
FORMAT = {"enum": ["text", "simple_format", "html", "md", "ansi"]}
RESULTS_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "anyOf": [{"required": ["score"]}, {"required": ["tests"]}],
    "properties": {
        "score": {"type": "number"},
        "execution_time": {"type": "number"},
        "output": {"type": "string"},
        "output_format": FORMAT,
        "test_output_format": FORMAT,
        "test_name_format": FORMAT,
        "visibility": VISIBILITY,
        "stdout_visibility": VISIBILITY,
        "extra_data": {"type": "object"},
        "tests": {"type": "array", "items": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "score": {"type": "number"},
                "max_score": {"type": "number"},
                "status": {"enum": ["passed", "failed"]},
                "name": {"type": "string"},
                "name_format": FORMAT,
                "number": {"type": "string"},
                "output": {"type": "string"},
                "output_format": FORMAT,
                "tags": {"type": "array", "items": {"type": "string"}},
                "visibility": VISIBILITY,
                "extra_data": {"type": "object"},
            },
        }},
        "leaderboard": {"type": "array", "items": {
            "type": "object", "required": ["name", "value"],
            "properties": {"name": {"type": "string"}, "order": {"enum": ["asc", "desc"]}},
        }},
    },
}


def unpack(zip_path: Path) -> Path:
    """A fresh autograder root laid out as Gradescope does: the zip in source/, run_autograder
    copied beside it. Not under pytest's tmp_path: that is root-only, and the sandbox's
    unprivileged user must reach the venv's interpreter inside the root."""
    root = Path(tempfile.mkdtemp(prefix="autograder-"))
    root.chmod(0o755)
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(root / "source")
        for info in zf.infolist():   # like unzip: the modes recorded in the zip
            (root / "source" / info.filename).chmod(info.external_attr >> 16 & 0o777)
    shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")
    return root


def run_autograder(root: Path, files: dict[str, str | Path]) -> dict:
    """Grade a submission (file name -> source text, or a symlink's target) and return the
    results.json run_autograder left, checked against Gradescope's fields."""
    import jsonschema   # here, not at collection: it takes most of a second
    submission = root / "submission"
    shutil.rmtree(submission, ignore_errors=True)
    shutil.rmtree(root / "results", ignore_errors=True)
    submission.mkdir()
    for name, content in files.items():
        if isinstance(content, Path):
            (submission / name).symlink_to(content)
        else:
            (submission / name).write_text(content, encoding="utf-8")
    done = subprocess.run([str(root / "run_autograder")], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "KATA_AUTOGRADER_ROOT": str(root)}, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))
    jsonschema.validate(results, RESULTS_SCHEMA)
    return results


@pytest.fixture(scope="module")
def zip_path(tmp_path_factory):
    out = tmp_path_factory.mktemp("gradescope") / "autograder.zip"
    done = subprocess.run([str(KATA), "gradescope", "--out", str(out), "--katas", "softmax,causal-mask"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.fixture(scope="module")
def installed(zip_path):
    """An autograder root after a real setup.sh. KATA_TORCH_INDEX_URL is emptied so that torch
    comes from pip's configured index (the default, PyTorch's CPU index, needs the internet)."""
    root = unpack(zip_path)
    try:
        done = subprocess.run(["bash", str(root / "source" / "setup.sh")], cwd=root / "source",
                              capture_output=True, text=True, timeout=900,
                              env={**os.environ, "KATA_AUTOGRADER_ROOT": str(root), "KATA_TORCH_INDEX_URL": ""})
        assert done.returncode == 0, done.stdout + done.stderr
        yield root
    finally:
        shutil.rmtree(root)


def test_zip_holds_the_scripts_a_wheel_of_the_kit_and_the_katas(zip_path):
    with zipfile.ZipFile(zip_path) as zf:
        modes = {i.filename: i.external_attr >> 16 & 0o777 for i in zf.infolist()}
        config = json.loads(zf.read("config.json"))
        wheel, = [n for n in modes if n.endswith(".whl")]
        with zf.open(wheel) as f, zipfile.ZipFile(f) as whl:
            packed = set(whl.namelist())
    assert modes["setup.sh"] == modes["run_autograder"] == 0o755
    assert set(modes) == {"setup.sh", "run_autograder", "config.json", wheel}
    assert config["katas"] == ["softmax", "causal-mask"]
    assert {"cli.py", "reference/softmax.py", "graders/softmax.py", "katas/softmax/kata.toml"} <= packed


def test_reference_submission_gets_full_marks(installed):
    results = run_autograder(installed, {k.learner_file: k.reference_path.read_text(encoding="utf-8")
                                         for k in KATAS})
    assert results["score"] == MAX_SCORE
    assert len(results["tests"]) == sum(len(k.checks) for k in KATAS)
    assert all(t["status"] == "passed" for t in results["tests"])
    # learner code ran as another user; the wheel with the reference must stay out of its reach
    assert stat.S_IMODE((installed / "source").stat().st_mode) & 0o077 == 0


def test_empty_submission_scores_zero_and_says_what_is_missing(installed):
    results = run_autograder(installed, {})
    assert results["score"] == 0
    assert all(t["status"] == "failed" for t in results["tests"])
    text = json.dumps(results)
    assert all(f"No {k.learner_file} was submitted." in text for k in KATAS)


def test_crashing_submission_scores_zero(installed):
    results = run_autograder(installed, {"softmax.py": "import os\nos._exit(0)\n",
                                         "causal_mask.py": "def causal_mask(T:\n"})
    assert results["score"] == 0
    assert len(results["tests"]) == sum(len(k.checks) for k in KATAS)


def test_a_symlink_to_the_installed_reference_earns_nothing(installed):
    reference, = (installed / "venv").glob("lib/python3*/site-packages/reference/softmax.py")
    results = run_autograder(installed, {"softmax.py": reference})
    assert results["score"] == 0


def test_failing_kata_grade_still_writes_results(installed, zip_path):
    # another root on the same installation, configured with a kata `kata grade` refuses
    root = unpack(zip_path)
    try:
        (root / "venv").symlink_to(installed / "venv")
        (root / "source" / "config.json").write_text(json.dumps({"katas": ["no-such-kata"]}), encoding="utf-8")
        results = run_autograder(root, {"softmax.py": "print('hi')\n"})
    finally:
        shutil.rmtree(root)
    assert results["score"] == 0 and "tests" not in results
    assert results["output"].startswith("Grading failed (kata grade exit status 2)")


def test_missing_setup_still_writes_results(zip_path):
    root = unpack(zip_path)   # setup.sh never ran: no venv
    try:
        results = run_autograder(root, {"softmax.py": "print('hi')\n"})
    finally:
        shutil.rmtree(root)
    assert results["score"] == 0
    assert "setup.sh did not finish" in results["output"]
