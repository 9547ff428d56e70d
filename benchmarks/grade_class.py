"""What grading a class costs: `kata grade` on LEARNERS x the katas, per (learner, kata) and in total.

The class is generated: each learner's file for each kata is, in turn, the reference, the stub,
one of the kata's bug oracles, a file that raises at import, or missing. For the same pairs
sampled, the script also times the naive way, one fresh `kata check KATA --file F` process per
pair, so the two costs are measured side by side in one run. A second `kata grade` shows what
resuming costs when nothing changed.

    python benchmarks/grade_class.py [--learners 50] [-j N] [--naive-sample 9] [--katas SLUG,...]

--katas grades those katas only (default: every kata), as `kata grade --katas` does: the tests run
the script on one kata, the fastest, to see that it runs.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graders.engine import manifest  # noqa: E402
from graders.engine.oracles import Bugs  # noqa: E402

KATA = Path(sys.executable).with_name("kata")
CRASH = "raise RuntimeError('this file fails at import')\n"


def make_class(root: Path, learners: int, katas: list[manifest.Kata]) -> int:
    """Write the class of ``katas`` under ``root``; returns how many files it holds."""
    written = 0
    for i in range(learners):
        folder = root / f"learner{i:03d}"
        folder.mkdir(parents=True)
        for j, kata in enumerate(katas):
            kind = (i + j) % 5
            bugs = Bugs(kata)
            if kind == 0:
                source = kata.reference_path.read_text()
            elif kind == 1:
                source = kata.stub_path.read_text()
            elif kind == 2:
                source = bugs.shim(bugs.codes[i % len(bugs.codes)])
            elif kind == 3:
                source = CRASH
            else:
                continue   # missing
            (folder / kata.learner_file).write_text(source)
            written += 1
    return written


def timed(cmd: list[str]) -> float:
    started = time.perf_counter()
    code = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if code.returncode not in (0, 1):   # 1: some check failed, as expected for most files
        sys.exit(f"{' '.join(cmd)} exited {code.returncode}:\n{code.stderr}")
    return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--learners", type=int, default=50)
    parser.add_argument("-j", "--jobs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--naive-sample", type=int, default=9, help="pairs timed with one `kata check` each")
    parser.add_argument("--katas", help="comma-separated slugs (default: every kata)")
    args = parser.parse_args()
    katas = [manifest.find(s) for s in args.katas.split(",")] if args.katas else manifest.katas()
    n_katas = len(katas)
    pairs = args.learners * n_katas
    with tempfile.TemporaryDirectory() as tmp:
        subs, out = Path(tmp) / "submissions", Path(tmp) / "out"
        files = make_class(subs, args.learners, katas)
        grade = [str(KATA), "grade", str(subs), "--out", str(out), "-j", str(args.jobs)]
        if args.katas:
            grade += ["--katas", ",".join(k.slug for k in katas)]
        total = timed(grade)
        resume = timed(grade)
        sample = sorted(p for p in subs.glob("*/*.py"))[: args.naive_sample]
        by_file = {k.learner_file: k.slug for k in katas}
        naive = sum(timed([str(KATA), "check", by_file[p.name], "--file", str(p), "--seed", "1"])
                    for p in sample) / max(1, len(sample))
        print(f"class: {args.learners} learners x {n_katas} katas = {pairs} pairs ({files} files, "
              f"{pairs - files} missing); {len(os.sched_getaffinity(0))} CPUs, -j {args.jobs}")
        print(f"kata grade:          {total:7.1f} s in total, {total / pairs:.3f} s per (learner, kata), "
              f"{total / files:.3f} s per submitted file")
        print(f"kata grade, resumed: {resume:7.1f} s (nothing changed: every pair skipped)")
        print(f"one `kata check` per pair (mean of {len(sample)}): {naive:.3f} s per pair, "
              f"{naive / (total / pairs):.1f}x the cost per pair of `kata grade`")


if __name__ == "__main__":
    main()
