"""What each kata's reference spends in its sandbox over a whole grading: the CPU time of the
worker's process tree for all its calls together, as the grading budget counts it (sandbox.Spent),
median of a few seeds. Writes katas/reference-cpu.json, from which each grading's budget is derived
(runner.grading_budget: twenty times this, at least a minute). Run it again when a kata is added or
its checks change much.

    python benchmarks/reference_cpu.py [--seeds 3] [--out FILE] [KATA ...]

--out writes another file (the tests do, so as to leave the kit's own alone).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
from pathlib import Path

from graders.engine.manifest import katas
from graders.engine.runner import REFERENCE_CPU, _grade, sandbox_for, zygote_for


def spent(kata, seeds: list[int]) -> float:
    """The median, over ``seeds``, of the CPU seconds a grading of the reference charged."""
    charged = []

    @contextlib.contextmanager
    def measured():
        with sandbox_for(kata, kata.files["reference"], device="cpu", zygote=zygote) as sandbox:
            yield sandbox
            charged.append(sandbox.spent.cpu)

    with zygote_for([kata], "cpu") as zygote:
        results = _grade(kata, kata.files["reference"], [(s, s) for s in seeds], device="cpu", zygote=zygote,
                         sandbox=measured)
    failed = [r for r in results if r["status"] != "passed"]
    if failed:
        raise SystemExit(f"{kata.slug}: the reference did not pass ({failed[0]['score']}/{failed[0]['max_score']})")
    return statistics.median(charged)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("katas", nargs="*", help="slugs (default: every kata)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REFERENCE_CPU)
    args = parser.parse_args()
    try:
        table = json.loads(args.out.read_text(encoding="utf-8"))
    except OSError:
        table = {}
    for kata in katas():
        if args.katas and kata.slug not in args.katas:
            continue
        table[kata.slug] = round(spent(kata, list(range(1, args.seeds + 1))), 2)
        print(f"{kata.slug:20s} {table[kata.slug]:7.2f} s of CPU time in the sandbox")
    args.out.write_text(json.dumps(dict(sorted(table.items())), indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
