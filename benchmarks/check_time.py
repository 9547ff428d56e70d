"""What a learner waits for: each kata's cold `kata check` of its reference, a fresh process each run.

For every kata (or those named), the reference is copied into an empty workspace under the
learner's file name and checked with `kata check KATA --seed 1 --json`, as root or as another
user (`--user UID`: what a normal user waits, sandbox and all). Runs alternate between the katas,
so that machine noise hits all alike; the median wall time of each is printed beside the time the
grading itself reported (its `duration_s`, without the process's start), slowest first.

    python benchmarks/check_time.py [--runs 3] [--user 64123] [KATA ...]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KATA = Path(sys.executable).with_name("kata")


def timed(slug: str, workspace: Path, user: int | None) -> tuple[float, float]:
    """(wall seconds, the grading's own duration_s) of one cold `kata check`."""
    started = time.perf_counter()
    done = subprocess.run([str(KATA), "check", slug, "--seed", "1", "--json", "--device", "cpu"], cwd=workspace,
                          capture_output=True, text=True, env={**os.environ, "KATA_WORKSPACE": str(workspace)},
                          **({} if user is None else {"user": user, "group": user, "extra_groups": []}))
    wall = time.perf_counter() - started
    try:
        result = json.loads(done.stdout)
    except ValueError:
        sys.exit(f"`kata check {slug}` printed no result (exit {done.returncode}): {done.stderr.strip()[-500:]}")
    if result["status"] != "passed":
        sys.exit(f"`kata check {slug}` of the reference did not pass: {result['status']} "
                 f"{result['score']}/{result['max_score']}")
    return wall, result["duration_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("katas", nargs="*", help="slugs (default: every kata)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--user", type=int, help="run each check as this user id (and group) instead of the caller")
    args = parser.parse_args()

    from graders.engine.manifest import find, katas

    chosen = [find(slug) for slug in args.katas] if args.katas else list(katas())
    with tempfile.TemporaryDirectory(prefix="kata-check-time-") as tmp:
        workspaces = {}
        for kata in chosen:
            workspace = Path(tmp) / kata.slug
            workspace.mkdir()
            shutil.copyfile(kata.files["reference"], workspace / kata.learner_file)
            if args.user is not None:
                os.chmod(tmp, 0o755)
                for path in (workspace, workspace / kata.learner_file):
                    os.chown(path, args.user, args.user)
            workspaces[kata.slug] = workspace
        walls = {k.slug: [] for k in chosen}
        graded = {k.slug: [] for k in chosen}
        for _ in range(args.runs):
            for kata in chosen:
                wall, duration = timed(kata.slug, workspaces[kata.slug], args.user)
                walls[kata.slug].append(wall)
                graded[kata.slug].append(duration)
    who = "as root" if os.geteuid() == 0 and args.user is None else f"as uid {args.user or os.geteuid()}"
    print(f"{'kata':20} {'kata check':>11} {'grading':>9}   (median of {args.runs} cold runs, {who})")
    for slug in sorted(walls, key=lambda s: -statistics.median(walls[s])):
        print(f"{slug:20} {statistics.median(walls[slug]):9.2f} s {statistics.median(graded[slug]):7.2f} s")
    print(f"{'every kata':20} {sum(statistics.median(w) for w in walls.values()):9.2f} s")


if __name__ == "__main__":
    main()
