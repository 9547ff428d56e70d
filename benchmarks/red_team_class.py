"""A class of hostile learners and honest controls, graded the way courses grade: `kata grade` under
bubblewrap, and `kata grade --container` in a grading container (the Gradescope autograder's
installation, under Docker's seccomp profile as tests/docker_seccomp.py imitates it; root only).

One learner per trick of containment's fourth round (issue 42: classes A to F) and, beside each,
a control that does the same work in plain sight, or none. The run passes when it finishes with
a complete result for every learner and kata, and no trick scores above its control on any check.
It prints each trick's total beside its control's, and how long each mode took.

    python benchmarks/red_team_class.py [--modes bwrap,container] [-j 2] [--only a,f]

--only keeps the learners of those classes (and "honest" the honest ones): the tests run the
script on class F alone, to see that it runs.
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
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graders.engine.manifest import find  # noqa: E402
from graders.engine.oracles import Bugs  # noqa: E402

KATA = Path(sys.executable).with_name("kata")
ATTACKS, ZOO = ROOT / "tests" / "attacks", ROOT / "tests" / "zoo"
KATAS = ("softmax", "mha-by-loop", "sliding-window", "tp-attention")

SOFTMAX = find("softmax").reference_path.read_text()
SLEEPER = "import time\n\n" + SOFTMAX + """

_right = softmax


def softmax(x, axis=-1):
    time.sleep(45)   # under each call's 50 s backstop, in every call
    return _right(x, axis)
"""
# Leaves a right softmax where a classmate's pair could find it (class E), and is right itself.
LEAVER = SOFTMAX + '''

for _folder in ("/tmp", "/dev/shm", "/var/tmp"):
    try:
        with open(_folder + "/softmax-for-a-classmate.py", "w") as _f:
            _f.write(open(__file__).read())
    except OSError:
        pass
'''
# Has no softmax of its own: looks for one a classmate left, and runs it (class E).
FINDER = '''import os

import numpy as np


def softmax(x, axis=-1):
    for folder in ("/tmp", "/dev/shm", "/var/tmp"):
        for root, _, names in os.walk(folder):
            for name in names:
                try:
                    text = open(os.path.join(root, name)).read()
                except OSError:
                    continue
                if "def softmax" in text:
                    found = {}
                    exec(text, found)
                    return found["softmax"](x, axis)
    return np.zeros_like(x)
'''
# Makes the kit's all_reduce in its own ranks send twice, so that a baseline measured there would
# hide the output sent a second time over send/recv (class B).
PATCH_KIT = """import sys

for _module in list(sys.modules.values()):
    _kit = getattr(_module, "KIT_FUNCTIONS", None)
    if isinstance(_kit, dict) and "all_reduce" in _kit:
        def _twice(tensor, once=_kit["all_reduce"]):
            once(tensor.clone())
            return once(tensor)
        _kit["all_reduce"] = _twice
"""
SEND_AGAIN = """
        peer, echo = dist.get_rank() ^ 1, torch.empty_like(out)
        if dist.get_rank() % 2:
            dist.recv(echo, peer)
            dist.send(out, peer)
        else:
            dist.send(out, peer)
            dist.recv(echo, peer)"""
SEED_READER = '''import numpy as np


def softmax(x, axis=-1):
    if np.random.get_state()[1][0] < 2**31:   # a self-study seed, it guesses: nothing to hide
        return np.zeros_like(x)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)
'''


def zoo(slug: str, name: str) -> str:
    return (ZOO / slug / name).read_text()


def attack(slug: str, name: str) -> str:
    return (ATTACKS / slug / name).read_text()


def the_class() -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """({learner: (kata, source)}, {trick learner: its control learner})."""
    learners = {
        # A: work hidden below the recorder; control: the same work in plain sight
        "a-subclass-handler": ("mha-by-loop", attack("mha-by-loop", "subclass_handler.py")),
        "a-annotation": ("mha-by-loop", attack("mha-by-loop", "annotation.py")),
        "a-in-repr": ("mha-by-loop", attack("mha-by-loop", "in_repr.py")),
        "a-control": ("mha-by-loop", zoo("mha-by-loop", "function_only__not-a-loop.py")),
        # C: a history kept in shared memory; control: the same history in plain tensors
        "c-shared-history": ("sliding-window", attack("sliding-window", "shared_history.py")),
        "c-control": ("sliding-window", zoo("sliding-window", "deque__rolling-buffer-grows.py")),
        # D: a right softmax that waits 45 s in every call; control: the same without the wait
        "d-sleeper": ("softmax", SLEEPER),
        "d-control": ("softmax", SOFTMAX),
        # E: one leaves its code for a classmate, one with no code of its own looks for it
        "e-leaver": ("softmax", LEAVER),
        "e-finder": ("softmax", FINDER),
        "e-control": ("softmax", find("softmax").stub_path.read_text()),
        # F: right only where its seed looks like a class's; control: right everywhere
        "f-seed-reader": ("softmax", SEED_READER),
        "f-control": ("softmax", SOFTMAX),
    }
    controls = {"a-subclass-handler": "a-control", "a-annotation": "a-control", "a-in-repr": "a-control",
                "c-shared-history": "c-control",
                "d-sleeper": "d-control", "e-finder": "e-control", "f-seed-reader": "f-control"}
    # B: tp-attention's ranks communicating where the process group's record does not look, or
    # patching the kit's code in their own processes; control: the reference
    tp = find("tp-attention").reference_path.read_text()
    reduce = "        dist.all_reduce(out)"
    assert reduce in tp
    group_method = "        dist.group.WORLD.allreduce([out]).wait()"
    learners["b-group-method"] = ("tp-attention", tp.replace(reduce, group_method))
    learners["b-patched-kit"] = ("tp-attention", PATCH_KIT + tp.replace(reduce, reduce + SEND_AGAIN))
    learners["b-control"] = ("tp-attention", tp)
    controls.update({"b-group-method": "b-control", "b-patched-kit": "b-control"})
    # Honest learners: each kata's reference, style-zoo solutions and bug oracles, to 32 and more.
    for slug in KATAS:
        kata = find(slug)
        learners[f"honest-{slug}-reference"] = (slug, kata.reference_path.read_text())
        for path in sorted((ZOO / slug).glob("*.py"))[:3]:
            learners[f"honest-{slug}-{path.stem}"] = (slug, path.read_text())
        bugs = Bugs(kata)
        for code in bugs.codes[:2]:
            learners[f"honest-{slug}-oracle-{code}"] = (slug, bugs.shim(code))
    return learners, controls


def write_class(subs: Path, learners: dict[str, tuple[str, str]]):
    for learner, (slug, source) in learners.items():
        (subs / learner).mkdir(parents=True)
        (subs / learner / find(slug).learner_file).write_text(source, encoding="utf-8")


def grade(mode: str, work: Path, jobs: int) -> tuple[Path, float]:
    """Grade the class in ``work`` in ``mode``; returns OUT and the seconds it took."""
    out = work / "out"
    command = [str(KATA), "grade", str(work / "subs"), "--out", str(out), "--katas", ",".join(KATAS), "-j", str(jobs)]
    root = installed(work) if mode == "container" else None
    if root is not None:
        command = [sys.executable, str(ROOT / "tests" / "docker_seccomp.py"), str(root / "venv" / "bin" / "kata"),
                   *command[1:], "--container"]
    try:
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        took = time.perf_counter() - started
    finally:
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
    if done.returncode not in (0, 1):
        sys.exit(f"`kata grade` in {mode} mode failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return out, took


def installed(work: Path) -> Path:
    """The Gradescope autograder's installation of these katas, set up as its setup.sh does."""
    root = Path(tempfile.mkdtemp(prefix="autograder-"))
    root.chmod(0o755)   # the sandbox user reaches the venv's interpreter in it
    zip_path = work / "autograder.zip"
    subprocess.run([str(KATA), "gradescope", "--out", str(zip_path), "--katas", ",".join(KATAS)], check=True,
                   capture_output=True)
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(root / "source")
        for info in zf.infolist():
            (root / "source" / info.filename).chmod(info.external_attr >> 16 & 0o777)
    subprocess.run(["bash", str(root / "source" / "setup.sh")], cwd=root / "source", check=True, capture_output=True,
                   env={**os.environ, "KATA_AUTOGRADER_ROOT": str(root), "KATA_TORCH_INDEX_URL": ""})
    return root


def judged(out: Path, learners: dict, controls: dict) -> list[str]:
    """What is wrong with the run's results: a learner or kata without a result, a grading the kit
    could not do, a trick above its control on some check."""
    problems = []
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        rows = {row["learner"]: row for row in csv.DictReader(f)}
    checks = {}
    for learner, (slug, _) in learners.items():
        if learner not in rows or rows[learner].get(slug) in (None, ""):
            problems.append(f"{learner}: no grade for {slug}")
            continue
        record = json.loads((out / ".kata" / "records" / learner / f"{slug}.json").read_text(encoding="utf-8"))
        result = record["result"]
        if any("Internal error" in (c.get("message") or "") for c in result["checks"]):
            problems.append(f"{learner}: the kit could not grade {slug}")
        checks[learner] = {c["id"]: c["score"] for c in result["checks"]}
    for trick, control in controls.items():
        above = [c for c, score in checks.get(trick, {}).items() if score > checks.get(control, {}).get(c, 0)]
        if above:
            problems.append(f"{trick}: above {control} on {', '.join(above)}")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="bwrap,container")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--only", help="the classes to keep (a to f, honest), comma-separated")
    args = parser.parse_args()
    learners, controls = the_class()
    if args.only:
        kept = tuple(f"{part}-" for part in args.only.split(","))
        learners = {name: pair for name, pair in learners.items() if name.startswith(kept)}
        controls = {trick: control for trick, control in controls.items() if trick in learners}
    print(f"{len(learners)} learners, {len(controls)} tricks beside their controls")
    failed = False
    for mode in args.modes.split(","):
        work = Path(tempfile.mkdtemp(prefix="kata-red-team-"))   # 0700: the sandbox user reaches none of it
        try:
            write_class(work / "subs", learners)
            out, took = grade(mode, work, args.jobs)
            problems = judged(out, learners, controls)
            with open(out / "grades.csv", newline="", encoding="utf-8") as f:
                totals = {row["learner"]: row["total"] for row in csv.DictReader(f)}
            print(f"\n{mode}: {took:.0f} s, {'complete, no trick above its control' if not problems else 'PROBLEMS'}")
            for trick, control in controls.items():
                print(f"  {trick:28s} {totals.get(trick, '-'):>6s}   {control:12s} {totals.get(control, '-'):>6s}")
            for problem in problems:
                print(f"  problem: {problem}")
            failed |= bool(problems)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
