"""The project's own test suite: its wall time by tier, each tier a fresh `python -m pytest`.

- collect: `python -m pytest --collect-only -q`, what every run (and every worker) pays first;
- quick:   `python -m pytest --kata KATA`, one kata's grader tests, content checks and style zoo
           (a developer's inner loop);
- full:    `python -m pytest`, everything, on one worker per core (what .ci/run calls);
- one-process: `python -m pytest -n 0`, everything in one process, for the ratio (slow: not run
           unless asked for).
Runs alternate between the tiers, so that machine noise hits all alike; medians are reported.

    python benchmarks/suite_time.py [--tiers collect,quick,full] [--kata mha] [--runs 3]
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIERS = {
    "collect": ["--collect-only", "-q"],
    "quick": ["--kata", "{kata}"],
    "full": [],
    "one-process": ["-n", "0"],
}


def run(args: list[str]) -> tuple[float, str]:
    """Wall seconds of one fresh `python -m pytest ARGS`, and its summary line."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=ROOT,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - started
    lines = done.stdout.strip().splitlines()
    summary = lines[-1] if lines else done.stderr.strip()
    if done.returncode != 0:
        sys.exit(f"`pytest {' '.join(args)}` failed (exit {done.returncode}): {summary}")
    return seconds, summary


def counted(summary: str) -> str:
    """How many tests a summary line reports (collected, or passed and skipped)."""
    found = re.findall(r"(\d+) (tests? collected|passed|skipped|failed|deselected)", summary)
    return ", ".join(f"{n} {what.split()[-1]}" for n, what in found) or summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiers", default="collect,quick,full", help=f"comma-separated, of {', '.join(TIERS)}")
    parser.add_argument("--kata", default="mha", help="the quick tier's kata (default: mha)")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    tiers = args.tiers.split(",")
    unknown = sorted(set(tiers) - set(TIERS))
    if unknown:
        parser.error(f"unknown tier(s) {', '.join(unknown)}: choose from {', '.join(TIERS)}")
    commands = {t: [a.format(kata=args.kata) for a in TIERS[t]] for t in tiers}
    times, summaries = {t: [] for t in tiers}, {}
    for _ in range(args.runs):
        for tier in tiers:
            seconds, summaries[tier] = run(commands[tier])
            times[tier].append(seconds)
    shown = {t: " ".join(["python -m pytest", *commands[t]]) for t in tiers}
    width = max(map(len, shown.values()))
    print(f"{'tier':12} {'command':{width}} {'median':>8} {'min':>8} {'max':>8}  tests")
    for tier in tiers:
        t = times[tier]
        print(f"{tier:12} {shown[tier]:{width}} {statistics.median(t):7.1f}s {min(t):7.1f}s {max(t):7.1f}s  "
              f"{counted(summaries[tier])}")
    if {"full", "one-process"} <= set(tiers):
        ratio = statistics.median(times["one-process"]) / statistics.median(times["full"])
        print(f"ratio: workers make the whole suite {ratio:.1f}x faster than one process")
    print(f"({args.runs} run(s) of each tier, alternating)")


if __name__ == "__main__":
    main()
