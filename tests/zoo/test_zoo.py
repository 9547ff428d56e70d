"""The style zoo: correct solutions written in the idioms of well-known public code, and known
bugs written in those idioms, graded as a learner would hand them in.

``tests/zoo/<kata>/<idiom>.py`` is a correct solution: full marks at five of SEEDS, small and large.
``tests/zoo/<kata>/<idiom>__<code>.py`` is a bug: failed, with diagnosis ``code``, at every seed of
SEEDS, losing the same checks at each.
A grader is right when code nobody here wrote is graded right; each file's docstring names the
idiom it imitates and, for a correct one, what about it a grader could get wrong.
"""
from pathlib import Path

import pytest

from conftest import SEEDS, uneven
from graders.engine.manifest import find, katas
from graders.engine.structure import TAMPERING

ZOO = Path(__file__).parent
FILES = sorted(p for p in ZOO.glob("*/*.py"))


def _id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


@pytest.mark.parametrize("path", [p for p in FILES if "__" not in p.stem], ids=_id)
def test_correct_solution_gets_full_marks(path, grade_at_seeds):
    seeds = SEEDS[::4]
    for seed, result in zip(seeds, grade_at_seeds(path.parent.name, path.read_text(), seeds)):
        lost = {c["id"]: c["message"] for c in result["checks"] if c["status"] not in ("passed", "skipped")}
        assert lost == {}, f"seed {seed}"
        assert result["score"] == result["max_score"] > 0


@pytest.mark.parametrize("path", [p for p in FILES if "__" in p.stem], ids=_id)
def test_bug_gets_its_diagnosis(path, grade_at_seeds):
    code = path.stem.split("__", 1)[1]
    assert code in find(path.parent.name).diagnoses, f"{code} is no diagnosis of {path.parent.name}"
    results = grade_at_seeds(path.parent.name, path.read_text(), SEEDS)
    for seed, result in zip(SEEDS, results):
        assert result["status"] == "failed", f"seed {seed}"
        assert code in result["diagnoses"], f"seed {seed}: {result['diagnoses']}"
        assert set(result["diagnoses"]) <= {code, TAMPERING}, f"seed {seed}: a wrong diagnosis too: {result['diagnoses']}"
    assert uneven(results, SEEDS) == {}
    assert len({r["score"] for r in results}) == 1   # so the same grade at every seed


def test_every_kata_has_four_idioms():
    for kata in katas():
        correct = [p for p in (ZOO / kata.slug).glob("*.py") if "__" not in p.stem]
        assert len(correct) >= 4, kata.slug
