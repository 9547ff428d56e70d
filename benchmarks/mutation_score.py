"""How many small mistakes each kata's grader catches: `kata lint --mutants` as a table, timed.

Every mutant of each reference (see graders/authoring/mutants.py) is graded in the sandbox at each
seed. Printed per kata: mutants, equivalent (answered every call exactly as the reference did),
killed, survivors, the share killed of the non-equivalent ones against the goal, and the time.

    python benchmarks/mutation_score.py [KATA ...] [--seeds 2] [--sample N] [--survivors]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graders.authoring import mutants  # noqa: E402
from graders.engine import manifest  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("katas", nargs="*", help="slugs (all katas by default)")
    parser.add_argument("--seed", type=int, default=1, help="the first seed")
    parser.add_argument("--seeds", type=int, default=2, help="seeds each mutant is graded at")
    parser.add_argument("--sample", type=int, help="only the first N mutants of each kata")
    parser.add_argument("--survivors", action="store_true", help="print each survivor's change")
    args = parser.parse_args()
    katas = [manifest.find(name) for name in args.katas] or list(manifest.katas())
    seeds = list(range(args.seed, args.seed + args.seeds))
    scores, times = [], []
    for kata in katas:
        started = time.perf_counter()
        scores.append(mutants.score(kata, seeds=seeds, sample=args.sample))
        times.append(time.perf_counter() - started)
    print(f"seeds {', '.join(map(str, seeds))}" + (f", first {args.sample} mutants of each kata" if args.sample else ""))
    print(mutants.table(scores))
    for score, seconds in zip(scores, times):
        print(f"{score.kata}: {seconds:.1f} s, {seconds / max(1, len(score.mutants)):.2f} s per mutant")
        if args.survivors:
            print("\n".join(mutants.survivors(score)) or "  no survivors")


if __name__ == "__main__":
    main()
