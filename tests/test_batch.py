"""`kata grade` end to end: a generated class graded by the installed command in a subprocess."""
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graders.engine.manifest import find

from conftest import needs_bwrap

# One class run, read by most tests: one worker runs them all.
pytestmark = [needs_bwrap, pytest.mark.xdist_group("batch")]

KATA = Path(sys.executable).with_name("kata")
KATAS = "softmax,causal-mask"
REFERENCE = Path(__file__).resolve().parents[1] / "reference"

# Gradescope's documented results.json fields (autograder specifications: "Output format").
GRADESCOPE_RESULTS = {
    "type": "object",
    "required": ["tests"],
    "properties": {
        "score": {"type": "number"},
        "execution_time": {"type": "number"},
        "output": {"type": "string"},
        "visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]},
        "stdout_visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]},
        "tests": {"type": "array", "items": {
            "type": "object",
            "required": ["name", "score", "max_score", "status"],
            "properties": {
                "name": {"type": "string"}, "number": {"type": "string"},
                "score": {"type": "number"}, "max_score": {"type": "number"},
                "status": {"enum": ["passed", "failed"]}, "output": {"type": "string"},
                "visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]}},
            "additionalProperties": False}},
    },
    "additionalProperties": False,
}

OVERFLOW = ("import numpy as np\n\ndef softmax(x, axis=-1):\n"
            "    e = np.exp(x)   # no max subtracted: overflows for large logits\n"
            "    return e / e.sum(axis=axis, keepdims=True)\n")
CLASS = {   # learner -> {file: source}; None: the reference, "stub": the stub
    "alice": {"softmax.py": None, "causal_mask.py": None},
    "bob": {"softmax.py": "stub", "causal_mask.py": "stub"},
    "carol": {"softmax.py": OVERFLOW},
    "dave": {"softmax.py": "def softmax(x, axis=-1)\n    return x\n",
             "causal_mask.py": "import os\nos._exit(0)\n"},
    "erin": {"notes.txt": "no kata file here"},
}


def write_class(root: Path):
    for learner, files in CLASS.items():
        folder = root / learner
        folder.mkdir(parents=True)
        for name, source in files.items():
            if source is None:
                source = (REFERENCE / name).read_text()
            elif source == "stub":
                kata = next(find(s) for s in KATAS.split(",") if find(s).learner_file == name)
                source = kata.stub_path.read_text()
            (folder / name).write_text(source)


def kata_grade(subs, out, *extra, **kwargs):
    return subprocess.run([str(KATA), "grade", str(subs), "--out", str(out), "--katas", KATAS, "--seed", "5",
                           *extra], capture_output=True, text=True, timeout=600, **kwargs)


def grades(out: Path) -> dict:
    with open(out / "grades.csv", newline="") as f:
        return {row["learner"]: row for row in csv.DictReader(f)}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("class")
    subs, out = root / "submissions", root / "out"
    write_class(subs)
    before = {p: p.read_bytes() for p in subs.rglob("*") if p.is_file()}
    run = kata_grade(subs, out, "-j", "2")
    assert run.returncode == 0, run.stderr
    assert {p: p.read_bytes() for p in subs.rglob("*") if p.is_file()} == before, "grading changed a submission"
    return subs, out, run


def test_grades_csv_has_every_learner_with_the_expected_scores(graded):
    _, out, _ = graded
    rows = grades(out)
    assert list(rows) == ["alice", "bob", "carol", "dave", "erin"]
    assert list(rows["alice"]) == ["learner", "softmax", "causal-mask", "total", "max"]
    full = find("softmax").max_score, find("causal-mask").max_score
    assert (float(rows["alice"]["softmax"]), float(rows["alice"]["causal-mask"])) == full
    assert float(rows["alice"]["total"]) == float(rows["alice"]["max"]) == sum(full)
    for learner in ("bob", "dave", "erin"):          # stub, crashing files, nothing submitted
        assert float(rows[learner]["total"]) == 0, learner
    assert 0 < float(rows["carol"]["softmax"]) < full[0]   # right except for large logits
    assert float(rows["carol"]["causal-mask"]) == 0        # missing


def test_results_json_is_gradescope_format_with_a_test_per_check(graded):
    import jsonschema   # here, not at collection: it takes most of a second
    _, out, _ = graded
    for learner in CLASS:
        results = json.loads((out / learner / "results.json").read_text())
        jsonschema.validate(results, GRADESCOPE_RESULTS)
        n_checks = len(find("softmax").checks) + len(find("causal-mask").checks)
        counted = [t for t in results["tests"]]
        assert len(counted) <= n_checks
        assert results["score"] == pytest.approx(sum(t["score"] for t in results["tests"]))
    alice = json.loads((out / "alice" / "results.json").read_text())
    assert all(t["status"] == "passed" for t in alice["tests"])
    carol = json.loads((out / "carol" / "results.json").read_text())
    failed = [t for t in carol["tests"] if t["status"] == "failed" and t["name"].startswith("softmax")]
    assert any("softmax-overflow" in t["output"] for t in failed)
    assert any("No causal_mask.py was submitted." in t["output"] for t in carol["tests"])


def test_feedback_and_summary_say_what_went_wrong(graded):
    _, out, _ = graded
    carol = (out / "carol" / "feedback.md").read_text()
    assert "softmax-overflow" in carol and find("softmax").diagnoses["softmax-overflow"].fix in carol
    assert "No `causal_mask.py` was submitted." in carol
    dave = (out / "dave" / "feedback.md").read_text()
    assert "SyntaxError" in dave and "exited with status 0" in dave
    summary = (out / "summary.md").read_text()
    assert "| softmax | 1 | 20% |" in summary               # alice alone has full marks
    assert "| `softmax-overflow` | softmax | 1 | 20% |" in summary


def test_rerun_skips_unchanged_pairs_and_regrades_changed_ones(graded, tmp_path):
    subs, out, _ = graded
    again = kata_grade(subs, out)
    assert again.returncode == 0 and "0 pair(s) to grade, 10 unchanged" in again.stderr
    (subs / "bob" / "softmax.py").write_text((REFERENCE / "softmax.py").read_text())
    changed = kata_grade(subs, out)
    assert changed.returncode == 0 and "1 pair(s) to grade, 9 unchanged" in changed.stderr
    assert float(grades(out)["bob"]["softmax"]) == find("softmax").max_score
    forced = kata_grade(subs, out, "--force")
    assert "10 pair(s) to grade, 0 unchanged" in forced.stderr


def test_ctrl_c_keeps_what_was_graded_and_the_next_run_resumes(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    # A second at import: the run is still grading when the interrupt comes, however fast the machine.
    slow = "import time\ntime.sleep(1)\n" + (REFERENCE / "softmax.py").read_text()
    for i in range(6):
        (subs / f"l{i}").mkdir(parents=True)
        (subs / f"l{i}" / "softmax.py").write_text(slow)
    proc = subprocess.Popen([str(KATA), "grade", str(subs), "--out", str(out), "--katas", "softmax", "-j", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    records = out / ".kata" / "records"
    deadline = time.monotonic() + 120
    while not list(records.glob("*/*.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)   # what Ctrl-C does: the whole foreground group
    _, err = proc.communicate(timeout=120)
    saved = len(list(records.glob("*/*.json")))
    if proc.returncode == 0:
        pytest.skip("the run finished before the interrupt arrived")
    assert proc.returncode == 130 and "Interrupted" in err
    assert 1 <= saved < 6
    resumed = subprocess.run([str(KATA), "grade", str(subs), "--out", str(out), "--katas", "softmax"],
                             capture_output=True, text=True, timeout=300)
    assert f"{6 - saved} pair(s) to grade, {saved} unchanged" in resumed.stderr
    assert all(float(r["softmax"]) == find("softmax").max_score for r in grades(out).values())


def test_out_inside_submissions_is_refused(tmp_path):
    (tmp_path / "alice").mkdir()
    run = subprocess.run([str(KATA), "grade", str(tmp_path), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "must not be inside SUBMISSIONS" in run.stderr


def test_a_link_out_of_the_learners_folder_is_not_graded(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    (subs / "mallory").mkdir(parents=True)
    (subs / "mallory" / "softmax.py").symlink_to(REFERENCE / "softmax.py")
    run = subprocess.run([str(KATA), "grade", str(subs), "--out", str(out), "--katas", "softmax"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert float(grades(out)["mallory"]["total"]) == 0
    assert "link to a file outside your submission" in (out / "mallory" / "feedback.md").read_text()


def test_a_full_disk_stops_with_a_sentence_and_the_same_command_continues(tmp_path):
    import resource

    subs, out = tmp_path / "subs", tmp_path / "out"
    write_class(subs)

    def small_files():   # every file this run writes may hold 1 kB: the first record does not fit
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))

    full = kata_grade(subs, out, preexec_fn=small_files)
    assert full.returncode == 2, full.stderr
    assert "Could not write to" in full.stderr and "run the same command again" in full.stderr
    assert "Traceback" not in full.stderr
    again = kata_grade(subs, out)
    assert again.returncode == 0, again.stderr
    assert set(grades(out)) == set(CLASS)
