"""`kata repro`: the check a run failed, as a script the learner runs outside the kit.

test_content.py runs a script of every kata (a public check a zoo bug fails: the learner's error,
then a pass once the file is the reference); here the command itself, as a learner meets it."""
import json
import subprocess
import sys

from graders.engine.manifest import ROOT, find
from graders.engine.plugin import check_names
from graders.engine.tape import Handle, Step
from graders.practice.repro import Writer

RAISES = """import numpy as np


def softmax(x, axis=-1):
    z = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis + 1, keepdims=True)   # the slip: another axis
"""
WRONG = RAISES.replace("axis=axis + 1, keepdims=True)", "axis=axis, keepdims=True) / 2")
RIGHT = RAISES.replace("axis=axis + 1", "axis=axis")


def test_kata_repro_runs_the_failed_check_with_the_learners_own_error_until_the_file_is_fixed(kata_cmd):
    file = kata_cmd.workspace / "softmax.py"
    file.write_text(RAISES)
    assert kata_cmd("check", "softmax", "--seed", "5").returncode == 1
    run = kata_cmd("repro", "softmax")
    assert run.returncode == 1, run.stdout + run.stderr
    script = kata_cmd.workspace / "repro" / "softmax.matches-reference.py"
    assert f"Wrote repro/{script.name}" in run.stdout
    # Its own traceback: the line of the learner's file that raised, outside the kit's sandbox.
    assert f'File "{file}", line 7, in softmax' in run.stderr and "AxisError" in run.stderr, run.stderr

    file.write_text(WRONG)   # now it returns, wrongly: the script's assertion says how
    again = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=script.parent)
    assert again.returncode == 1 and "AssertionError" in again.stderr and "Mismatched" in again.stderr, again.stderr

    file.write_text(RIGHT)
    fixed = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=script.parent)
    assert fixed.returncode == 0 and "now returns what the check expects" in fixed.stdout, fixed.stderr
    source = script.read_text()
    assert "from softmax import softmax" in source and "softmax(x, axis=" in source and "same(got, expected)" in source


def test_hidden_checks_are_never_reproduced(kata_cmd):
    (kata_cmd.workspace / "softmax.py").write_text(RAISES)   # fails the hidden checks too
    result = json.loads(kata_cmd("check", "softmax", "--json", "--seed", "5").stdout)
    kata = find("softmax")
    hidden = set(check_names(kata.files["hidden"]))
    assert hidden and hidden <= {c["id"] for c in result["checks"] if c["status"] == "failed"}
    kept = kata_cmd.workspace / ".kata" / "repro" / "softmax"
    assert not {p.stem for p in kept.iterdir()} & hidden   # no tape of theirs is even kept
    for check in sorted(hidden):
        refused = kata_cmd("repro", "softmax", check)
        assert refused.returncode == 2 and "hidden checks are never reproduced" in refused.stderr
    assert not list((kata_cmd.workspace / "repro").glob("*sums*"))


def test_repro_says_what_there_is_to_reproduce(kata_cmd):
    assert "run `kata check softmax` first" in kata_cmd("repro", "softmax").stderr
    (kata_cmd.workspace / "softmax.py").write_text(RIGHT)
    assert kata_cmd("check", "softmax").returncode == 0
    assert "failed no public check" in kata_cmd("repro", "softmax").stderr
    (kata_cmd.workspace / "softmax.py").write_text(WRONG)
    kata_cmd("check", "softmax")
    said = kata_cmd("repro", "softmax", "input-not-modified").stderr
    assert "did not fail in your last run" in said and "`matches-reference`" in said
    assert "has no check `nope`" in kata_cmd("repro", "softmax", "nope").stderr


def test_a_call_that_draws_random_numbers_draws_the_same_in_the_script(kata_cmd):
    """sdpa-swap's dropout in train mode: what the reference returns depends on the generators'
    state, which the script must seed as the kit does before each call (with the grading's seed
    hashed, as the worker does), or even the reference fails its own script."""
    file = kata_cmd.workspace / "sdpa_swap.py"
    file.write_text((ROOT / "tests" / "zoo" / "sdpa-swap" / "hf_eager__manual-path-no-dropout.py").read_text())
    assert kata_cmd("check", "sdpa-swap", "--seed", "5").returncode == 1
    run = kata_cmd("repro", "sdpa-swap", "manual-path-dropout")
    assert run.returncode == 1 and "AssertionError" in run.stderr, run.stdout + run.stderr
    file.write_text(find("sdpa-swap").reference_path.read_text())
    script = kata_cmd.workspace / "repro" / "sdpa-swap.manual-path-dropout.py"
    fixed = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=script.parent)
    assert fixed.returncode == 0 and "now returns what the check expects" in fixed.stdout, fixed.stderr


def test_a_name_the_learners_code_chose_reaches_the_script_as_a_name_only(tmp_path):
    """A class's name comes from the learner's code (its __qualname__ is theirs to set): the script
    names a variable after it, with letters, digits and _ only, and never runs it as code."""
    evil = "Cache\nimport os; os.system('touch PWNED')  # "
    steps = [Step(None, None, ["KVCache"], [8], {}, got=Handle(1, evil)),
             Step(None, 1, ["reset"], [], {}, got=None)]
    info = {"names": {}, "seed": 1, "file": str(tmp_path / "kv_cache.py")}
    text, _, asserted = Writer(find("kv-cache"), steps, None, None, info, "reset-starts-a-new-sequence",
                               None).script(tmp_path / "s.py")
    compile(text, "s.py", "exec")
    assert not asserted and "os.system" not in text and "systemtouch_pwned = KVCache(8)" in text
