"""Every @cuda check on a GPU: the katas that have them graded on CUDA by `kata check --device cuda`.

For each such kata: the reference at several seeds, and each style-zoo file (tests/zoo/<kata>/)
once: a correct one (``name.py``) must score full marks, a buggy one (``name__CODE.py``) must be
diagnosed CODE. Prints a line per grading (the @cuda checks' statuses and what they measured,
sdpa-swap's benchmark included) and exits 1 if any grade is not what it should be, 2 without CUDA.

    python benchmarks/cuda_checks.py [--seeds 1,2,3] [KATA ...]     (default: every kata with an @cuda check)
"""
from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def cuda_katas() -> list[str]:
    """The katas whose graders hold an @cuda check."""
    from graders.engine.manifest import katas

    return [k.slug for k in katas() if cuda_ids(k.slug)]


def check(slug: str, source: Path, seed: int) -> dict:
    """`kata check SLUG --file COPY --device cuda --seed SEED --json` on a copy of ``source``."""
    from graders.engine.manifest import find

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / find(slug).learner_file
        copy.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")   # the sandbox may not read reference/
        done = subprocess.run([sys.executable, "-c", "import cli; cli.main()", "check", slug, "--file", str(copy),
                               "--device", "cuda", "--seed", str(seed), "--json", "--workspace", tmp],
                              capture_output=True, text=True, cwd=ROOT, timeout=600,
                              env={"NO_COLOR": "1", "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    if not done.stdout.strip():
        raise SystemExit(f"{slug} {source.name}: no result\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def cuda_ids(slug: str) -> set[str]:
    """The ids of the kata's @cuda checks (a check ``test_a_b`` is ``a-b``)."""
    from graders.engine.manifest import find

    tree = ast.parse(find(slug).grader_path.read_text(encoding="utf-8"))
    return {f.name.removeprefix("test_").replace("_", "-") for f in tree.body if isinstance(f, ast.FunctionDef)
            and any(ast.unparse(d) == "pytest.mark.cuda" for d in f.decorator_list)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("katas", nargs="*")
    parser.add_argument("--seeds", default="1,2,3")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device here: the @cuda checks need one", file=sys.stderr)
        return 2
    from graders.engine.manifest import find

    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, Python {sys.version.split()[0]}")
    wrong = 0
    for slug in args.katas or cuda_katas():
        kata = find(slug)
        runs = [(kata.reference_path, int(seed)) for seed in args.seeds.split(",")]
        runs += [(path, 1) for path in sorted(kata.files["zoo"].glob("*.py"))]
        ids = cuda_ids(slug)
        for source, seed in runs:
            result = check(slug, source, seed)
            code = source.stem.partition("__")[2]
            cuda = [c for c in result["checks"] if c["id"] in ids]
            ok = (code in {c.get("diagnosis") for c in result["checks"]} if code
                  else result["score"] == result["max_score"] and all(c["status"] == "passed" for c in cuda))
            wrong += not ok
            print(f"{'ok ' if ok else 'BAD'} {slug} {source.name} seed {seed}: {result['score']:g}/{result['max_score']:g}"
                  f" ({result['status']}); " + ", ".join(f"{c['id']} {c['status']}" for c in cuda)
                  + (f"; expected diagnosis {code}" if code else ""))
            for c in cuda:
                for line in c["message"].splitlines():
                    if line.startswith("measured") or not ok:
                        print(f"      {c['id']}: {line}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
