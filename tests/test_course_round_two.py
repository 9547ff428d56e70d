"""A class as students hand work in, graded by the real `kata grade`: what the class files say of
each case must never mislead a TA. An unused `import numpy` is its own diagnosis, not
`tampering`; an empty file is said once and listed; missing, not started, empty and graded-zero
work stand apart in summary.md and summary.png."""
import csv
import json
import subprocess

import pytest

from graders.engine.manifest import find
from graders.engine.structure import TAMPERING

from conftest import KATA, needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.xdist_group("course-round-two")]

IMPORT_NOT_ALLOWED = "import-not-allowed"
MHA = find("mha")
REFERENCE = MHA.reference_path.read_text()
CLASS = {   # learner -> mha.py (None: no file)
    "ada": REFERENCE,
    "ben": "import numpy as np\n" + REFERENCE,            # an import left over from a notebook, never used
    "cy": REFERENCE + "\nimport inspect\n",                # introspection: what tampering names
    "dee": "# TODO: mha\n\n",                               # handed in empty
    "eve": MHA.stub_path.read_text(),                       # not started
    "fay": "import torch\n\n\ndef attention(q, k, v):\n    return q\n",   # the wrong file: graded, 0 points
    "gus": None,
}
# The checks that judge what the code calls: a library they cannot see inside costs these.
STRUCTURE = ("state-dict-keys", "parameter-count", "banned-api")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("class")
    subs, out = root / "subs", root / "out"
    for learner, text in CLASS.items():
        (subs / learner).mkdir(parents=True)
        if text is not None:
            (subs / learner / "mha.py").write_text(text)
    run = subprocess.run([str(KATA), "grade", str(subs), "--out", str(out), "--katas", "mha", "--banned-fails"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    with open(out / "grades.csv", newline="") as f:
        rows = {row["learner"]: row for row in csv.DictReader(f)}
    return out, rows


def results(out, learner):
    return json.loads((out / learner / "results.json").read_text())


def test_an_unused_library_import_is_its_own_diagnosis_and_no_misconduct(graded):
    out, rows = graded
    lost = sum(MHA.checks[cid] for cid in STRUCTURE)
    # Under --banned-fails a kata with tampering scores 0; an import of numpy loses the structure checks only.
    assert float(rows["ben"]["mha"]) == MHA.max_score - lost and float(rows["cy"]["mha"]) == 0
    ben = {t["name"].split(": ", 1)[1]: t for t in results(out, "ben")["tests"]}
    feedback = (out / "ben" / "feedback.md").read_text()
    assert f"Diagnosis: {IMPORT_NOT_ALLOWED}" in feedback and TAMPERING not in feedback
    assert "import numpy (line 1)" in feedback and "no misconduct" in feedback
    assert {t["status"] for t in ben.values() if IMPORT_NOT_ALLOWED in t["output"]} == {"failed"}
    summary = (out / "summary.md").read_text()
    assert f"| `{IMPORT_NOT_ALLOWED}` | mha | 1 |" in summary and f"| `{TAMPERING}` | mha | 1 |" in summary
    assert summary.split(f"| `{IMPORT_NOT_ALLOWED}` |")[1].split("\n")[0].endswith("| `ben` |")
    assert summary.split(f"| `{TAMPERING}` |")[1].split("\n")[0].endswith("| `cy` |")


def test_an_empty_file_is_said_once_and_listed_to_look_at(graded):
    out, rows = graded
    assert (rows["dee"]["mha"], rows["dee"]["mha status"]) == ("0", "empty")
    said = "`mha.py` is empty: it holds no code, so nothing was graded."
    feedback = (out / "dee" / "feedback.md").read_text()
    assert feedback.count(said) == 1 and "Your file has no" not in feedback
    tests = results(out, "dee")["tests"]
    assert said in tests[0]["output"] and all(said not in t["output"] for t in tests[1:])
    assert "| mha | empty | `dee` |" in (out / "summary.md").read_text()


def test_missing_not_started_empty_and_graded_zero_stand_apart_in_the_summary(graded):
    out, _ = graded
    summary = (out / "summary.md").read_text()
    assert ("| kata | passed (all checks) | pass rate | mean score of work handed in | failed with points | graded 0 "
            "| not started | empty | error | missing |") in summary
    # Handed in: ada (full), ben (all but the structure checks), cy (0 under --banned-fails), eve, fay.
    mean = (2 * MHA.max_score - sum(MHA.checks[cid] for cid in STRUCTURE)) / 5
    assert f"| mha | 1 | 14% | {mean:.2f}/{MHA.max_score:g} | 1 | 2 | 1 | 1 | 0 | 1 |" in summary, summary
    for standing, learners in (("missing", "`gus`"), ("empty", "`dee`"), ("not-started", "`eve`"),
                               ("graded 0", "`cy`, `fay`")):
        assert f"| mha | {standing} | {learners} |" in summary, standing


def test_a_due_date_and_late_policy_put_the_penalty_beside_the_score(tmp_path):
    """When work came: the course's own record (OUT/submitted.csv), nbgrader's timestamp.txt, else
    the file's time; each late day, or part of one, costs the policy's share of the total."""
    import datetime
    import os

    subs, out = tmp_path / "subs", tmp_path / "out"
    softmax = find("softmax")
    due = datetime.datetime(2026, 12, 1, 23, 59, tzinfo=datetime.timezone.utc)
    for learner in ("listed", "stamped", "touched"):
        (subs / learner).mkdir(parents=True)
        (subs / learner / "softmax.py").write_text(softmax.reference_path.read_text())
    (out).mkdir()
    (out / "submitted.csv").write_text("learner,submitted\nlisted,2026-12-01T20:00:00+00:00\n")
    (subs / "stamped" / "timestamp.txt").write_text("2026-12-03 09:00:00.000000 UTC\n")   # as nbgrader writes it
    late = (due + datetime.timedelta(hours=3)).timestamp()
    os.utime(subs / "touched" / "softmax.py", (late, late))

    def grade(*flags):
        return subprocess.run([str(KATA), "grade", str(subs), "--out", str(out), "--katas", "softmax", *flags],
                              capture_output=True, text=True, timeout=600)

    bad = grade("--due", "2026-12-01T23:59", "--late-penalty", "10%/day")
    assert bad.returncode == 2 and "names no time zone" in bad.stderr
    done = grade("--due", due.isoformat(), "--late-penalty", "10%/day")
    assert done.returncode == 0, done.stderr
    for again in (False, True):   # kept in the class file: a later run without the flags grades by the same deadline
        with open(out / "grades.csv", newline="") as f:
            rows = {row["learner"]: row for row in csv.DictReader(f)}
        full = softmax.max_score
        assert {name: (r["submitted from"], r["days late"], float(r["late penalty"]), float(r["total after penalty"]))
                for name, r in rows.items()} == {"listed": ("submitted.csv", "0", 0, full),
                                                 "stamped": ("timestamp.txt", "2", 0.2 * full, 0.8 * full),
                                                 "touched": ("file time", "1", 0.1 * full, 0.9 * full)}
        assert rows["stamped"]["submitted"] == "2026-12-03T09:00:00+00:00"
        said = (out / "stamped" / "feedback.md").read_text()
        assert "2 day(s) after the due date (2026-12-01T23:59:00+00:00): the late policy (10%/day) takes 2 point(s)" in said
        assert "by the due date" in (out / "listed" / "feedback.md").read_text()
        if not again:
            assert grade("--force").returncode == 0
