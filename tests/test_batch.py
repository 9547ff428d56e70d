"""`kata grade` end to end: a generated class graded by the installed command in a subprocess."""
import csv
import json
import os
import shutil
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
# The reference after `import time; time.sleep(1)`: time is no module softmax lists, so its structure
# check (banned-api) scores 0, diagnosed tampering; every other check passes.
SLOW_SCORE = find("softmax").max_score - find("softmax").checks["banned-api"]

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
    return subprocess.run([str(KATA), "grade", str(subs), "--out", str(out), "--katas", KATAS, *extra],
                          capture_output=True, text=True, timeout=600, **kwargs)


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
    assert all(float(r["softmax"]) == SLOW_SCORE for r in grades(out).values())


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


# Right except where the window is odd: which hidden draws catch it depends on the inputs drawn.
ODD_WINDOWS = (REFERENCE / "sliding_window.py").read_text().replace(
    "def sliding_window_mask(Tq: int, Tk: int, window: int, device=None) -> torch.Tensor:",
    "def sliding_window_mask(Tq: int, Tk: int, window: int, device=None) -> torch.Tensor:\n"
    "    window += window % 2")


def test_the_same_files_get_the_same_grades_on_every_run_and_from_a_copy_of_out(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    for i in range(6):
        (subs / f"l{i}").mkdir(parents=True)
        (subs / f"l{i}" / "sliding_window.py").write_text(ODD_WINDOWS)
    grade = lambda subs, out, *extra: subprocess.run(
        [str(KATA), "grade", str(subs), "--out", str(out), "--katas", "sliding-window", *extra],
        capture_output=True, text=True, timeout=600)
    assert grade(subs, out).returncode == 0
    first = (out / "grades.csv").read_bytes()
    scores = {float(r["total"]) for r in grades(out).values()}
    assert max(scores) < find("sliding-window").max_score   # the bug is caught somewhere
    assert grade(subs, out, "--force").returncode == 0
    assert (out / "grades.csv").read_bytes() == first
    # Another machine: a copy of the submissions and of OUT (its class file holds the secret).
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(subs, elsewhere / "subs")
    (elsewhere / "out" / ".kata").mkdir(parents=True)
    shutil.copy2(out / ".kata" / "class.json", elsewhere / "out" / ".kata" / "class.json")
    assert grade(elsewhere / "subs", elsewhere / "out").returncode == 0
    assert (elsewhere / "out" / "grades.csv").read_bytes() == first
    # A replay says so; a record that does not match what its file gets is found out.
    replay = grade(subs, out, "--learners", "l0,l3", "--replay")
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert replay.stdout.count("the same grade as recorded.") == 2
    record = out / ".kata" / "records" / "l3" / "sliding-window.json"
    forged = json.loads(record.read_text())
    forged["result"]["score"] += 1
    record.write_text(json.dumps(forged))
    replay = grade(subs, out, "--learners", "l3", "--replay")
    assert replay.returncode == 1 and "DIFFERENT from the recorded" in replay.stdout
    seeds = json.loads(record.read_text())["seeds"]
    assert all(2**31 <= seed < 2**32 for seed in seeds)   # never a release seed


BANNED_SOFTMAX = "import torch\n\ndef softmax(x, axis=-1):\n    return torch.softmax(torch.as_tensor(x), dim=axis).numpy()\n"


def test_the_policy_for_graded_work(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    for name, source in {"ann": BANNED_SOFTMAX, "carol": OVERFLOW}.items():
        (subs / name).mkdir(parents=True)
        (subs / name / "softmax.py").write_text(source)
    run = subprocess.run([str(KATA), "grade", str(subs), "--out", str(out), "--katas", "softmax", "--graded"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert float(grades(out)["ann"]["softmax"]) == 0          # a banned API fails the kata
    ann = (out / "ann" / "feedback.md").read_text()
    assert "banned-api" in ann and "banned API" in ann
    carol = (out / "carol" / "feedback.md").read_text()
    overflow = find("softmax").diagnoses["softmax-overflow"]
    assert overflow.explain in carol and overflow.fix not in carol and "Fix:" not in carol
    hidden = [c for c in json.loads((out / ".kata" / "records" / "carol" / "softmax.json").read_text())
              ["result"]["checks"] if c["visibility"] == "hidden"]
    assert hidden
    results = json.loads((out / "carol" / "results.json").read_text())
    shown = [t for t in results["tests"] if "hidden check" in t["name"]]
    assert [t["name"] for t in shown] == [f"softmax: hidden check {i} of {len(hidden)}" for i in range(1, len(hidden) + 1)]
    assert all(t["visibility"] == "after_due_date" for t in shown)
    for check in hidden:   # neither the id nor the name of a hidden check reaches the learner
        for text in (carol, (out / "carol" / "results.json").read_text()):
            assert check["id"] not in text and check["name"] not in text
    assert "Policy: A banned API scores the kata 0" in (out / "summary.md").read_text()
    # Kept in the class file: a later run without the flags grades by the same rules.
    again = subprocess.run([str(KATA), "grade", str(subs), "--out", str(out), "--katas", "softmax", "--force"],
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and float(grades(out)["ann"]["softmax"]) == 0


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def test_a_grading_process_that_dies_takes_its_pair_to_a_fresh_one(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    (subs / "ada").mkdir(parents=True)
    (subs / "ada" / "softmax.py").write_text("import time\ntime.sleep(1)\n" + (REFERENCE / "softmax.py").read_text())
    proc = subprocess.Popen([str(KATA), "grade", str(subs), "--out", str(out), "--katas", "softmax", "-j", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    pool = []
    while not pool and time.monotonic() < deadline:   # the first pool's grading process
        pool = [c for c in _children(proc.pid) if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
        time.sleep(0.05)
    assert pool, "no grading process appeared"
    os.kill(pool[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert float(grades(out)["ada"]["softmax"]) == SLOW_SCORE
