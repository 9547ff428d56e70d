"""Hidden checks of the softmax kata: fresh values at each grading, never in a student bundle."""
import numpy as np

from graders.engine import expect


def test_sums_to_one(learner, bugs, kata, case_rng, rng):
    """slices along axis sum to 1"""
    # A shape of its own, 2-D to 4-D: a 1-D array has one axis only, so a softmax that ignores `axis`
    # passes there (the public checks cover 1-D).
    shape = tuple(int(n) for n in case_rng.integers(2, 8, size=case_rng.integers(2, 5)))
    x = rng.standard_normal(shape) * rng.uniform(0.5, 20)
    tol = kata.tolerance("float64", expect.magnitude(x))   # as for the values: see check_values
    for axis in range(-len(shape), len(shape)):
        got = learner.softmax(x, axis=axis)
        expect.type_of(got, np.ndarray, call=f"softmax(x, axis={axis})")
        sums = got.sum(axis=axis)
        expect.values(sums, np.ones_like(sums), call=f"softmax(x, axis={axis}).sum(axis={axis})",
                      case="hidden inputs", what="the sums along axis", **tol,
                      diagnose=lambda: bugs.match(got, lambda impl: impl.softmax(x, axis=axis), **tol))
