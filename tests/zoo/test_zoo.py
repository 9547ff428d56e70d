"""The style zoo: correct solutions written in the idioms of well-known public code, and known
bugs written in those idioms, graded as a learner would hand them in.

``tests/zoo/<kata>/<idiom>.py`` is a correct solution: full marks at every seed of SEEDS.
``tests/zoo/<kata>/<idiom>__<code>.py`` is a bug: failed, with diagnosis ``code``, at every seed.
A grader is right when code nobody here wrote is graded right; each file's docstring names the
idiom it imitates and, for a correct one, what about it a grader could get wrong.
"""
from pathlib import Path

import pytest

from graders.engine.manifest import find, katas
from graders.engine.runner import grade

ZOO = Path(__file__).parent
SEEDS = [1, 2, 3, 4, 5]
FILES = sorted(p for p in ZOO.glob("*/*.py"))


def _id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def graded(path: Path, seed: int, zygotes, tmp_path) -> dict:
    kata = find(path.parent.name)
    learner = tmp_path / kata.learner_file   # the file name a learner hands in
    learner.write_text(path.read_text())
    return grade(kata, learner, seed=seed, hidden_seed=seed, device="cpu", zygote=zygotes(kata.framework))


@pytest.mark.parametrize("path", [p for p in FILES if "__" not in p.stem], ids=_id)
def test_correct_solution_gets_full_marks(path, zygotes, tmp_path):
    for seed in SEEDS:
        result = graded(path, seed, zygotes, tmp_path)
        lost = {c["id"]: c["message"] for c in result["checks"] if c["status"] not in ("passed", "skipped")}
        assert lost == {}, f"seed {seed}"
        assert result["score"] == result["max_score"] > 0


@pytest.mark.parametrize("path", [p for p in FILES if "__" in p.stem], ids=_id)
def test_bug_gets_its_diagnosis(path, zygotes, tmp_path):
    code = path.stem.split("__", 1)[1]
    assert code in find(path.parent.name).diagnoses, f"{code} is no diagnosis of {path.parent.name}"
    for seed in SEEDS:
        result = graded(path, seed, zygotes, tmp_path)
        assert result["status"] == "failed", f"seed {seed}"
        assert code in result["diagnoses"], f"seed {seed}: {result['diagnoses']}"


def test_every_kata_has_four_idioms():
    for kata in katas():
        correct = [p for p in (ZOO / kata.slug).glob("*.py") if "__" not in p.stem]
        assert len(correct) >= 4, kata.slug
