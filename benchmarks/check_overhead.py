"""What the sandbox costs: `kata check KATA` against plain in-process pytest, side by side.

Both sides grade the reference of each kata with the same grader, the same seed and the same
checks, each as a fresh process (what a learner waits for):
- sandboxed: the installed `kata check KATA --file ref.py` (a worker process, pipes, .npy);
- plain:     this script's `--plain` mode: pytest runs the same grader, but the learner's module is
             executed in the pytest process itself (cases.InProcessSandbox: the worker's request
             handler called directly, no process, no pipes, no isolation).
Runs alternate between the two so that machine noise hits both alike; medians are reported.

    python benchmarks/check_overhead.py [--runs 7] [KATA ...]     (default: softmax mha)
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KATA = Path(sys.executable).with_name("kata")
SEED = "1"


def plain(slug: str, file: str):
    from graders.authoring.cases import InProcessSandbox
    from graders.engine.manifest import find
    from graders.engine.runner import grade_seeds

    kata = find(slug)
    source = Path(file).read_bytes()
    with tempfile.TemporaryDirectory() as folder:
        result, = grade_seeds(kata, Path(file), [int(SEED)], device="cpu",
                              sandbox=lambda: contextlib.nullcontext(InProcessSandbox(kata, source, folder)))
    assert result["status"] == "passed", result


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("katas", nargs="*", default=["softmax", "mha"])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--plain", nargs=2, metavar=("KATA", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain:
        return plain(*args.plain)

    from graders.engine.manifest import find

    print(f"{'kata':<10} {'sandboxed kata check':>21} {'plain pytest':>13} {'ratio':>6}   (median of {args.runs} cold runs)")
    for slug in args.katas:
        kata = find(slug)
        with tempfile.TemporaryDirectory() as tmp:
            ref = Path(tmp) / kata.learner_file
            ref.write_text(kata.reference_path.read_text())   # a sandbox may not read reference/
            sandboxed = [str(KATA), "check", slug, "--file", str(ref), "--seed", SEED, "--device", "cpu"]
            baseline = [sys.executable, __file__, "--plain", slug, str(ref)]
            timed(sandboxed), timed(baseline)   # warm the page cache for both
            a, b = [], []
            for _ in range(args.runs):
                a.append(timed(sandboxed))
                b.append(timed(baseline))
        ta, tb = statistics.median(a), statistics.median(b)
        print(f"{slug:<10} {ta:>19.3f} s {tb:>11.3f} s {ta / tb:>6.2f}x")


if __name__ == "__main__":
    main()
