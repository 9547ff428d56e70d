"""Every check's cases have the same structure at every seed of deep.SEEDS (shapes, lengths, masks,
schedules: all but the float values), proven by a dry run of the checks on the reference that grades
nothing (graders/authoring/cases.py). So a known mistake meets the same cases whatever the seed, and
the suite may grade each one at a single seed (test_content.py). `kata lint --deep` proves it at
all of SEEDS, and its record holds only for the content it graded (test_content.py); the suite
proves it again at three of them (deep.cases_seeds), drawn anew at each change of the kata or engine."""
import dataclasses

import pytest

from graders.authoring.cases import seed_dependent
from graders.authoring.deep import SEEDS, cases_seeds
from graders.engine.manifest import find, katas


@pytest.mark.parametrize("slug", [k.slug for k in katas()])
def test_every_checks_cases_have_the_same_structure_at_every_seed(slug):
    said = seed_dependent(find(slug), cases_seeds(find(slug)))
    assert not said, "\n".join(said.values())


def _planted(tmp_path, old, new):
    """softmax, with its grader changed from ``old`` to ``new`` (in a file of its own name: pytest
    imports a grader under its file's name, once per process)."""
    kata = find("softmax")
    grader = tmp_path / f"{tmp_path.name}.py"
    source = kata.files["grader"].read_text()
    assert source.count(old) == 1
    grader.write_text(source.replace(old, new))
    return dataclasses.replace(kata, paths={"grader": grader})


def test_a_check_whose_shape_comes_from_the_values_is_found(tmp_path):
    kata = _planted(tmp_path, "x = rng.standard_normal((3, 5)).astype(dtype)",
                    "x = rng.standard_normal((3, 5 + int(3 * rng.random()))).astype(dtype)")
    said = seed_dependent(kata, list(SEEDS[:4]))
    assert list(said) == ["dtype-preserved"]
    assert "argument 1: float64 array of shape (3, " in said["dtype-preserved"]


def test_a_check_whose_mask_comes_from_the_values_is_found(tmp_path):
    kata = _planted(tmp_path, "x[[0, 1, 1, 3], [2, 0, 5, 3]] = -np.inf", "x[rng.random(x.shape) < 0.2] = -np.inf")
    said = seed_dependent(kata, list(SEEDS[:4]))
    assert list(said) == ["neg-inf-gets-zero"]
    assert "argument 1: float64 array of shape (4, 6) against float64 array of shape (4, 6) " \
           "(where it holds inf, NaN or 0 differ)" in said["neg-inf-gets-zero"]


def test_a_check_that_draws_its_structure_from_rng_is_stopped(tmp_path):
    """rng gives values only: integer draws (the usual way to draw a shape) come from case_rng."""
    kata = _planted(tmp_path, "x = rng.standard_normal((3, 5)).astype(dtype)",
                    "x = rng.standard_normal((3, int(rng.integers(4, 9)))).astype(dtype)")
    said = seed_dependent(kata, list(SEEDS[:2]))
    assert list(said) == ["dtype-preserved"]
    assert "AttributeError: rng.integers: a check's rng draws its values only" in said["dtype-preserved"]
