"""Grader of the softmax kata (katas/softmax/README.md)."""
import numpy as np

from graders.engine import expect
from graders.engine.structure import banned_used, check_untampered

SHAPES = [(9,), (4, 7), (2, 5, 6), (2, 3, 4, 5)]
DTYPES = [np.float64, np.float32]


def expected(bugs, x, axis):
    """The reference in float64, cast back to the input's dtype."""
    return bugs.reference.softmax(x.astype(np.float64), axis).astype(x.dtype)


def check_values(got, x, axis, bugs, kata, case, call=None):
    """``got`` is softmax(x, axis), to the tolerance of x's dtype and magnitude: a backward-stable
    softmax (the log-sum-exp form) errs by about one rounding of its largest logit.

    Only the values: a floating-point answer of another dtype (float64 for float32 input) is judged
    here by what it holds, and loses dtype-preserved alone, so that one slip is reported once."""
    call, want = call or f"softmax(x, axis={axis})", expected(bugs, x, axis)
    tol = kata.tolerance(x.dtype, expect.magnitude(x))
    diagnose = lambda: bugs.match(got, lambda impl: impl.softmax(x, axis=axis), **tol)
    expect.type_of(got, np.ndarray, call=call, case=case)
    expect.that(got.shape == want.shape, "The result has the wrong shape.", call=call, case=case,
                got=f"shape {got.shape}", expected=f"shape {want.shape}", diagnose=diagnose)
    expect.that(got.dtype.kind == "f", "The result is not a floating-point array.", call=call, case=case,
                got=str(got.dtype), expected=str(x.dtype))
    expect.values(got, want, call=call, case=case, **tol, diagnose=diagnose)


def check_against_reference(learner, bugs, kata, x, axis, case):
    check_values(learner.softmax(x, axis=axis), x, axis, bugs, kata, case)


def test_matches_reference(learner, bugs, kata, rng):
    """matches the reference on 1-D to 4-D inputs, every axis, float32 and float64"""
    for shape in SHAPES:
        for dtype in DTYPES:
            x = rng.standard_normal(shape).astype(dtype)
            for axis in range(-len(shape), len(shape)):
                check_against_reference(learner, bugs, kata, x, axis,
                                        f"x: {np.dtype(dtype)} {shape}, standard normal")
    x = rng.standard_normal((2, 5, 6))   # 3-D: a default of 1 or -2 would normalise another axis
    check_values(learner.softmax(x), x, -1, bugs, kata, "x: float64 (2, 5, 6), standard normal", call="softmax(x)")


def test_stable_for_large_logits(learner, bugs, kata, rng):
    """finite and exact for huge logits"""
    x = rng.standard_normal((4, 7))
    scales = np.array([1.0, 1e3, 1.0, 1e3])[:, None]
    cases = [(x + 1000, "x + 1000"), (x * 1e4, "x * 1e4"),
             (x * scales, "rows whose scales differ by 1e3"), ((x + 1000).astype(np.float32), "float32 x + 1000")]
    for logits, label in cases:
        for axis in (-1, 0):
            check_against_reference(learner, bugs, kata, logits, axis,
                                    f"{label}: {logits.dtype} {logits.shape}, x standard normal")


def test_neg_inf_gets_zero(learner, bugs, kata, rng):
    """an -inf logit gets weight exactly 0"""
    for dtype in DTYPES:
        x = rng.standard_normal((4, 6)).astype(dtype)
        x[[0, 1, 1, 3], [2, 0, 5, 3]] = -np.inf
        case = f"x: {np.dtype(dtype)} (4, 6) with -inf at [0, 2], [1, 0], [1, 5], [3, 3]"
        got = learner.softmax(x, axis=-1)
        expect.type_of(got, np.ndarray, call="softmax(x, axis=-1)", case=case)
        weights = got[np.isneginf(x)] if got.shape == x.shape else got
        expect.that(got.shape == x.shape and np.all(weights == 0), "An -inf logit must get weight exactly 0.",
                    call="softmax(x, axis=-1)", case=case,
                    got=f"weights {np.array2string(np.asarray(weights), precision=3)} at the -inf positions",
                    expected="0.0 at every -inf position")
        check_against_reference(learner, bugs, kata, x, -1, case)


def test_dtype_preserved(learner, bugs, kata, rng):
    """float32 in, float32 out; float64 in, float64 out"""
    for dtype in DTYPES:
        x = rng.standard_normal((3, 5)).astype(dtype)
        got = learner.softmax(x, axis=-1)
        expect.type_of(got, np.ndarray, call="softmax(x, axis=-1)")
        # dtype-not-preserved names float64 that came in and stayed: float32 in, float64 out.
        upcast = (x.dtype, got.dtype) == (np.float32, np.float64)
        expect.that(got.dtype == x.dtype, "The result's dtype differs from the input's.",
                    call="softmax(x, axis=-1)", case=f"x: {x.dtype} (3, 5)", got=str(got.dtype), expected=str(x.dtype),
                    diagnose=lambda: "dtype-not-preserved" if upcast else None)
        check_values(got, x, -1, bugs, kata, f"x: {x.dtype} (3, 5)")


def test_input_not_modified(learner, rng):
    """the input array is not modified"""
    # Only this property: the value checks judge what comes back.
    x = rng.standard_normal((3, 5)) * 10
    for axis in (-1, 0):
        got, (x_after,), _ = learner.softmax.echo(x, axis=axis)
        expect.form(got, np.ndarray, x.shape, call=f"softmax(x, axis={axis})")   # a softmax's answer
        expect.that(np.array_equal(x_after, x), "softmax wrote into its input array.",
                    call=f"softmax(x, axis={axis})", case="x: float64 (3, 5)",
                    got="x changed by the call", expected="x left as it was: build new arrays instead of `x -= ...`")


def test_banned_api(learner, kata, rng):
    """no library softmax: written with NumPy"""
    # Only this property: an array of x's shape made without a banned API, whatever its values.
    learner.softmax(rng.standard_normal((3, 5)), axis=-1)   # first call: lazy imports happen before recording
    x = rng.standard_normal((3, 5))   # fresh: no earlier call saw it, so memoised outputs cannot skip the ops
    with learner.recording() as ops:
        got = learner.softmax(x, axis=-1)
    expect.form(got, np.ndarray, x.shape, call="softmax(x, axis=-1)")
    used = banned_used(learner.source, ops, kata.banned)
    expect.that(not used, "softmax uses a library shortcut this kata forbids.", call="softmax(x, axis=-1)",
                got=", ".join(used), expected="only NumPy operations", diagnose=lambda: "banned-api")
    check_untampered(learner, call="softmax(x, axis=-1)")
