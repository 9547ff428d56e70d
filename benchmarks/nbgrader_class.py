"""nbgrader's autograde against the kit's, side by side, on the same class of notebooks.

A course is generated with `kata nbgrader init` (softmax, causal-mask, mha) and released with
`nbgrader generate_assignment`; each learner's notebooks hold, in turn, the reference, the stub
or a bug oracle. Then the class is graded twice, in the same run:
- nbgrader's path: `nbgrader autograde`, which executes every notebook in a Jupyter kernel (its
  test cells call the kit's checks from that kernel);
- the kit's path: `kata nbgrader autograde`, which grades the solution cells in its sandbox and
  writes the scores into the same gradebook.

    python benchmarks/nbgrader_class.py [--learners 20] [-j N] [--katas SLUG,...]

--katas makes the course of those katas (default: softmax, causal-mask, mha): the tests run the
script on one kata, the fastest, to see that it runs.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graders.engine.manifest import find  # noqa: E402
from graders.engine.oracles import Bugs  # noqa: E402

KATA = Path(sys.executable).with_name("kata")
KATAS = ("softmax", "causal-mask", "mha")
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}   # nbgrader runs alembic


def run(*cmd, cwd) -> float:
    started = time.perf_counter()
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=ENV, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return time.perf_counter() - started


def exported(course: Path) -> dict[str, float]:
    """learner -> raw score, from `nbgrader export`."""
    run(sys.executable, "-m", "nbgrader", "export", cwd=course)
    with open(course / "grades.csv", newline="") as f:
        return {row["student_id"]: float(row["raw_score"]) for row in csv.DictReader(f)}


def make_class(course: Path, learners: int, katas=KATAS):
    for i in range(learners):
        folder = course / "submitted" / f"learner{i:03d}" / "ps1"
        folder.mkdir(parents=True)
        for j, slug in enumerate(katas):
            kata, bugs = find(slug), Bugs(find(slug))
            nb = json.loads((course / "release" / "ps1" / f"{kata.module}.ipynb").read_text())
            cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("solution"))
            kind = (i + j) % 3
            if kind != 1:   # kind 1: the released stub, untouched
                code = kata.reference_path.read_text() if kind == 0 else bugs.shim(bugs.codes[i % len(bugs.codes)])
                cell["source"] = "".join(cell["source"]).split("\n")[0] + "\n" + code
            (folder / f"{kata.module}.ipynb").write_text(json.dumps(nb))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--learners", type=int, default=20)
    parser.add_argument("-j", "--jobs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--katas", default=",".join(KATAS), help="comma-separated slugs (default: %(default)s)")
    args = parser.parse_args()
    katas = tuple(find(slug).slug for slug in args.katas.split(","))
    notebooks = args.learners * len(katas)
    with tempfile.TemporaryDirectory() as tmp:
        course = Path(tmp) / "course"
        run(KATA, "nbgrader", "init", course, "--assignment", "ps1", "--katas", ",".join(katas), cwd=tmp)
        run(sys.executable, "-m", "nbgrader", "generate_assignment", "ps1", "--force", cwd=course)
        make_class(course, args.learners, katas)
        nbgrader = run(sys.executable, "-m", "nbgrader", "autograde", "ps1", "--force", cwd=course)
        by_nbgrader = exported(course)
        shutil.rmtree(course / "autograded")
        kit = run(KATA, "nbgrader", "autograde", course, "ps1", "-j", str(args.jobs), cwd=course)
        by_kit = exported(course)
    print(f"class: {args.learners} learners x {len(katas)} katas = {notebooks} notebooks; "
          f"{len(os.sched_getaffinity(0))} CPUs")
    print(f"nbgrader autograde:      {nbgrader:7.1f} s, {nbgrader / notebooks:.3f} s per notebook")
    print(f"kata nbgrader autograde: {kit:7.1f} s, {kit / notebooks:.3f} s per notebook (-j {args.jobs})")
    print(f"ratio: the kit's path is {nbgrader / kit:.1f}x faster per notebook")
    same = sum(by_nbgrader[s] == by_kit[s] for s in by_kit)
    print(f"the two paths gave the same total to {same} of {len(by_kit)} learners "
          f"(class total {sum(by_nbgrader.values()):g} and {sum(by_kit.values()):g})")


if __name__ == "__main__":
    main()
