"""`kata run`: each kata README's worked example ("Try it") runs with the learner's file and is
compared with the printout the README shows, which is the reference's."""
import dataclasses
import json
import subprocess
import sys

import pytest

from graders.authoring.lint import check_try_it
from graders.engine.manifest import ROOT, find, katas
from graders.practice import run
from graders.practice.notebook import SOLUTION_TAG, cell, document

SOFTMAX = (ROOT / "reference" / "softmax.py").read_text()

# One process runs every README's example but those that start ranks (`kata run tp-attention`
# below runs that one), each with the kata's reference imported under the learner's module name.
EVERY_EXAMPLE = """
import contextlib, io, json, sys
from pathlib import Path
import numpy, torch
from graders.engine.manifest import katas
from graders.practice.run import example, starts_ranks

printed = {}
for kata in katas():
    source, _ = example(kata)
    if starts_ranks(source):
        continue
    sys.modules[Path(kata.learner_file).stem] = kata.load("reference")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, f"{kata.slug} README", "exec"), {"__name__": "__main__"})
    printed[kata.slug] = out.getvalue()
    torch.set_printoptions(profile="default")
    numpy.set_printoptions()
print(json.dumps(printed))
"""


def test_every_readme_example_prints_what_its_text_block_shows():
    ran = subprocess.run([sys.executable, "-c", EVERY_EXAMPLE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    printed = json.loads(ran.stdout)
    assert set(printed) == {k.slug for k in katas()} - {"tp-attention", "ring-attention"}
    wrong = {slug: run.differences(out, run.example(find(slug))[1]) for slug, out in printed.items()}
    assert not any(wrong.values()), "\n".join(f"{slug}: {said}" for slug, said in wrong.items() if said)


def test_kata_run_prints_the_values_and_says_whether_they_are_the_readmes(kata_cmd, tmp_path):
    ws = kata_cmd.workspace
    (ws / "softmax.py").write_text(SOFTMAX)
    ran = kata_cmd("run", "softmax")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    _, expected = run.example(find("softmax"))
    assert expected in ran.stdout and "Same as the README's" in ran.stdout

    (ws / "softmax.py").write_text((ROOT / "katas/softmax/stub.py").read_text())
    ran = kata_cmd("run", "softmax")
    assert ran.returncode == 1
    assert "not written yet" in ran.stderr and "write softmax" in ran.stderr and "Traceback" not in ran.stderr

    (ws / "softmax.py").write_text(SOFTMAX.replace("np.max(x, axis=axis, keepdims=True)", "np.max(x)"))
    ran = kata_cmd("run", "softmax")
    assert ran.returncode == 1 and "differ" in ran.stdout and "from the README's" in ran.stdout
    assert "yours" in ran.stdout and "README" in ran.stdout

    notebook = tmp_path / "mine.ipynb"
    notebook.write_text(json.dumps(document([cell("code", "a", "import numpy as np"),
                                             cell("code", "b", SOFTMAX, {"tags": [SOLUTION_TAG]})])))
    ran = kata_cmd("run", "softmax", "--file", str(notebook))
    assert ran.returncode == 0 and "Same as the README's" in ran.stdout, ran.stdout + ran.stderr

    ran = kata_cmd("run", "softmax", "--file", str(tmp_path / "missing.py"))
    assert ran.returncode == 2


@pytest.mark.parametrize("slug", ["tp-attention", "ring-attention"])
def test_kata_run_runs_a_rank_kata_on_two_ranks(kata_cmd, slug):
    module = find(slug).module
    (kata_cmd.workspace / f"{module}.py").write_text((ROOT / "reference" / f"{module}.py").read_text())
    ran = kata_cmd("run", slug)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "rank 0" in ran.stdout and "rank 1" in ran.stdout and "Same as the README's" in ran.stdout


def test_a_run_that_does_not_finish_is_stopped(tmp_path):
    path = tmp_path / "softmax.py"
    path.write_text("while True:\n    pass\n")
    outcome = run.run(find("softmax"), path, timeout=1)
    assert outcome.timed_out and outcome.returncode != 0


def test_numbers_may_differ_in_their_last_printed_digit_only():
    assert run.differences("tensor([0.1235, -0.0000])\n", "tensor([ 0.1234,  0.0000])\n") == []
    assert run.differences("tensor([0.1237])\n", "tensor([0.1234])\n")
    assert run.differences("ids 0 0 1\n", "ids 0 0 0\n")
    assert run.differences("a\nb\n", "a\n")


@pytest.mark.parametrize("readme, says", [
    ("# K\n\n## Tasks\n", "no `## Try it` section"),
    ("## Try it\n```python\nprint(1)\n```\n", "one ```python block, then the ```text block"),
    ("## Try it\n```python\nprint(1)\n```\n```text\n1\n```\n```python\nprint(2)\n```\n",
     "one ```python block, then the ```text block"),
])
def test_lint_wants_one_try_it_example_and_its_printout(tmp_path, readme, says):
    kata = find("softmax")
    (tmp_path / "README.md").write_text(readme)
    ok, what = check_try_it(dataclasses.replace(kata, dir=tmp_path))
    assert not ok and says in what, what
