"""How a result reads (graders/engine/report.py): one explanation per diagnosis, the [hidden] tag
in its own column, code never capitalised, and a replay line that names the file it graded."""
import re

from graders.engine.failures import sentence
from graders.engine.manifest import ROOT, find
from graders.engine.report import render

ZOO = ROOT / "tests" / "zoo"


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_a_diagnosis_given_on_several_checks_is_explained_once(grade_source):
    # An inverted mask fails checks that judge different properties, none built on another.
    kata = find("causal-mask")
    result = grade_source("causal-mask", (ZOO / "causal-mask" / "nanogpt__mask-inverted.py").read_text(), seed=1)
    on = [c["id"] for c in result["checks"] if c["diagnosis"] == "mask-inverted"]
    assert len(on) >= 2
    shown = plain(render(result, kata))
    assert shown.count(kata.diagnoses["mask-inverted"].explain.splitlines()[0]) == 1
    assert shown.count(kata.diagnoses["mask-inverted"].fix) == 1
    assert f"diagnosis mask-inverted  (also given on {', '.join(on[1:])})" in shown
    assert all(f"diagnosis mask-inverted  (explained above, at {on[0]})" in shown for _ in on[1:])


def test_the_hidden_tag_keeps_the_names_in_one_column(grade_source):
    kata = find("softmax")
    result = grade_source("softmax", (ZOO / "softmax" / "d2l__softmax-overflow.py").read_text(), seed=1)
    assert {c["visibility"] for c in result["checks"]} == {"visible", "hidden"}
    lines = plain(render(result, kata)).splitlines()
    starts = {line.index(c["name"], 4 + len(c["id"])) for c in result["checks"]
              for line in lines if line[4:].startswith(c["id"] + " ")}
    assert len(starts) == 1, "\n".join(lines)


def test_code_at_the_start_of_a_message_keeps_its_case(grade_source):
    assert [sentence(t) for t in ("the output", "each row sum", "dq", "lse of block 2", "K_win", "dk summed over keys",
                                  "softmax(float64[9], axis=-1) used more", "split_heads(x, H)[b, h, t]")] == \
        ["The output", "Each row sum", "dq", "lse of block 2", "K_win", "dk summed over keys",
         "softmax(float64[9], axis=-1) used more", "split_heads(x, H)[b, h, t]"]
    result = grade_source("softmax", "def softmax(x, axis=-1):\n    while True:\n        pass\n", timeout_s=0.3)
    messages = [c["message"] for c in result["checks"] if c["status"] == "error"]
    assert messages and all(m.startswith("softmax(") for m in messages), messages
    assert "did not finish within 0.3 s of CPU time" in messages[0]


def test_the_replay_line_names_a_file_that_is_not_the_workspaces(kata_cmd, tmp_path):
    scratch = tmp_path / "attempt 2.py"
    scratch.write_text((ZOO / "softmax" / "d2l__softmax-overflow.py").read_text())
    run = kata_cmd("check", "softmax", "--file", str(scratch), "--seed", "5")
    assert f"Replay exactly this run: kata check softmax --file '{scratch}' --seed 5" in run.stdout
    (kata_cmd.workspace / "softmax.py").write_text(scratch.read_text())
    run = kata_cmd("check", "softmax", "--seed", "5")
    assert "Replay exactly this run: kata check softmax --seed 5" in run.stdout


WRONG_AXIS = """\
import numpy as np
def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=0, keepdims=True))
    return e / e.sum(axis=0, keepdims=True)
"""


def test_a_check_that_fails_with_the_diagnosis_of_one_it_builds_on_says_so_once(grade_source):
    alone = {c["id"]: c for c in grade_source("softmax", WRONG_AXIS)["checks"]}
    assert alone["sums-to-one"]["diagnosis"] == alone["matches-reference"]["diagnosis"] == "softmax-wrong-axis"
    result = grade_source("softmax", WRONG_AXIS, builds_on={"sums-to-one": ("matches-reference",)})
    checks = {c["id"]: c for c in result["checks"]}
    assert checks["matches-reference"]["message"] == alone["matches-reference"]["message"]
    assert checks["sums-to-one"] == {**alone["sums-to-one"], "diagnosis": None, "same_cause_as": "matches-reference",
                                     "duration_s": checks["sums-to-one"]["duration_s"],
                                     "message": "Same cause as `matches-reference`, which failed first, diagnosed "
                                                "softmax-wrong-axis: that mistake fails this check too. Fix it, then "
                                                "check again."}
    assert result["score"] == grade_source("softmax", WRONG_AXIS)["score"]   # the score is the same


def test_a_check_with_a_diagnosis_of_its_own_keeps_it_though_one_it_builds_on_failed(grade_source):
    """Two mistakes: a global max (stable-for-large-logits) and float64 returned for float32
    (dtype-preserved). The later check is not charged to the earlier one by order."""
    source = WRONG_AXIS.replace("    e = np.exp(x - x.max(axis=0, keepdims=True))\n    return e / e.sum(axis=0, keepdims=True)",
                                "    x = x.astype(np.float64)\n    e = np.exp(x - x.max())\n"
                                "    return e / e.sum(axis=axis, keepdims=True)")
    alone = {c["id"]: c for c in grade_source("softmax", source)["checks"]}
    result = grade_source("softmax", source, builds_on={"dtype-preserved": ("stable-for-large-logits",)})
    checks = {c["id"]: c for c in result["checks"]}
    assert checks["stable-for-large-logits"]["diagnosis"] == "softmax-global-max"
    assert checks["dtype-preserved"]["diagnosis"] == "dtype-not-preserved"
    assert "same_cause_as" not in checks["dtype-preserved"]
    assert checks["dtype-preserved"]["message"] == alone["dtype-preserved"]["message"]
    assert result["diagnoses"] == ["softmax-global-max", "dtype-not-preserved"]


def test_a_check_without_a_diagnosis_keeps_its_report_and_says_what_it_builds_on_failed(grade_source):
    identity = "def softmax(x, axis=-1):\n    return x.copy()\n"
    alone = {c["id"]: c for c in grade_source("softmax", identity)["checks"]}
    assert alone["sums-to-one"]["diagnosis"] is None and alone["matches-reference"]["diagnosis"] is None
    result = grade_source("softmax", identity, builds_on={"sums-to-one": ("matches-reference",)})
    checks = {c["id"]: c for c in result["checks"]}
    assert "same_cause_as" not in checks["sums-to-one"]
    assert checks["sums-to-one"]["message"] == alone["sums-to-one"]["message"] + (
        "\nalso failed: `matches-reference`, which this check builds on: fixing that first may fix this one too.")


def test_the_readmes_example_result_is_what_kata_check_prints(kata_cmd):
    """README.md's "A result looks like this" is a real run: the same file at the same seed prints
    every line of it (a line the README shortens with "..." is compared up to there), timing aside."""
    readme = (ROOT / "README.md").read_text()
    example = readme.split("A result looks like this:\n\n```\n", 1)[1].split("```", 1)[0].splitlines()
    (kata_cmd.workspace / "softmax.py").write_text(
        "import numpy as np\n\n\ndef softmax(x, axis=-1):\n    e = np.exp(x)\n    return e / e.sum(axis=axis, keepdims=True)\n")
    run = kata_cmd("check", "softmax", "--seed", "7")
    shown = re.sub(r"\d+\.\d\d s · \S+", "TIME · FILE", run.stdout)
    assert run.returncode == 1
    for line in example:
        line = re.sub(r"\d+\.\d\d s · \S+", "TIME · FILE", line)
        if line.strip() == "...":
            continue
        assert line.removesuffix(" ...") in shown, line
