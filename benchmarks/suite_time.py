"""The project's own test suite: its wall time by tier, each tier a fresh `python -m pytest`, against
its budget.

- collect: `python -m pytest --collect-only -q`, what every run (and every worker) pays first;
- quick:   `python -m pytest --kata KATA`, one kata's own tests, content rules and recorded gradings
           (an author's inner loop): at most 2 minutes, for every kata;
- full:    `python -m pytest`, everything, one worker per core (what .ci/run calls): at most
           15 minutes. Its report (JUnit XML) gives each kata's share, the time of the tests about
           it over the workers: at most 30 s each, so that the catalogue can grow;
- one-process: `python -m pytest -n 0`, everything in one process, for the ratio (slow: not run
           unless asked for).
Runs alternate between the tiers, so that machine noise hits all alike; medians are reported.

    python benchmarks/suite_time.py [--tiers collect,quick,full] [--kata mha | --kata all] [--runs 3]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIERS = ("collect", "quick", "full", "one-process")
BUDGET_S = {"full": 15 * 60, "quick": 2 * 60}
SHARE_BUDGET_S = 30   # what one kata may add to the full tier
WORKERS = os.cpu_count() or 1   # pytest-xdist's `-n auto`


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


def shares(report: Path, slugs: list[str]) -> dict[str, float]:
    """{kata: seconds of the full run's tests about it, over the workers}: a test is about the kata
    its parameters name first (the longest slug that fits: mha-by-loop before mha), or whose own
    tests file it is."""
    found = dict.fromkeys(slugs, 0.0)
    longest_first = sorted(slugs, key=len, reverse=True)
    for case in ET.parse(report).iter("testcase"):
        name, where = case.get("name", ""), case.get("classname", "")
        params = name.partition("[")[2]
        slug = next((s for s in longest_first if params.startswith((f"{s}-", f"{s}]"))
                     or where.endswith(f"test_kata_{s.replace('-', '_')}")), None)
        if slug is not None:
            found[slug] += float(case.get("time", 0.0))
    return {slug: seconds / WORKERS for slug, seconds in found.items()}


def verdict(seconds: float, budget: float) -> str:
    return f"{budget:6.0f}s  {'ok' if seconds <= budget else 'OVER'}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiers", default="collect,quick,full", help=f"comma-separated, of {', '.join(TIERS)}")
    parser.add_argument("--kata", default="mha", help="the quick tier's kata, or `all` for each kata in turn")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    tiers = args.tiers.split(",")
    unknown = sorted(set(tiers) - set(TIERS))
    if unknown:
        parser.error(f"unknown tier(s) {', '.join(unknown)}: choose from {', '.join(TIERS)}")

    from graders.engine.manifest import katas

    slugs = [k.slug for k in katas()]
    quick = slugs if args.kata == "all" else args.kata.split(",")
    report = Path(tempfile.mkdtemp(prefix="kata-suite-time-")) / "full.xml"
    commands = {}   # (tier, label) -> pytest arguments
    for tier in tiers:
        if tier == "quick":
            commands.update({(tier, slug): ["--kata", slug] for slug in quick})
        else:
            commands[(tier, tier)] = {"collect": ["--collect-only", "-q"], "full": [f"--junitxml={report}"],
                                      "one-process": ["-n", "0"]}[tier]
    times, summaries, share = {key: [] for key in commands}, {}, {}
    for _ in range(args.runs):
        for key, command in commands.items():
            seconds, summaries[key] = run(command)
            times[key].append(seconds)
            if key[0] == "full":
                for slug, seconds in shares(report, slugs).items():
                    share.setdefault(slug, []).append(seconds)

    shown = {key: " ".join(["python -m pytest", *(a for a in commands[key] if not a.startswith("--junitxml"))])
             for key in commands}
    width = max(map(len, shown.values()))
    print(f"{'tier':12} {'command':{width}} {'median':>8} {'min':>8} {'max':>8} {'budget':>7}  tests")
    for key in commands:
        t, budget = times[key], BUDGET_S.get(key[0])
        print(f"{key[0]:12} {shown[key]:{width}} {statistics.median(t):7.1f}s {min(t):7.1f}s {max(t):7.1f}s "
              f"{verdict(statistics.median(t), budget) if budget else '':>11}  {counted(summaries[key])}")
    if share:
        print(f"\neach kata's share of the full tier (its tests' time over {WORKERS} workers, median):")
        for slug in sorted(share, key=lambda s: -statistics.median(share[s])):
            median = statistics.median(share[slug])
            print(f"  {slug:20} {median:6.1f}s {verdict(median, SHARE_BUDGET_S)}")
    if ("full", "full") in times and ("one-process", "one-process") in times:
        ratio = statistics.median(times[("one-process", "one-process")]) / statistics.median(times[("full", "full")])
        print(f"ratio: workers make the whole suite {ratio:.1f}x faster than one process")
    print(f"({args.runs} run(s) of each tier, alternating)")


if __name__ == "__main__":
    main()
