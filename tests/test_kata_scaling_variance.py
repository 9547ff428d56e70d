"""The scaling-variance grader on solutions written the way learners write them (not via the bug
oracles), and the Monte-Carlo tolerances it derives."""
import numpy as np
import pytest

from conftest import checks_by_id
from graders.engine.failures import CheckFailed
from graders.engine.manifest import find
from graders.engine.oracles import Bugs
from graders.scaling_variance import check_float, std_rtol, weight_case
from reference.scaling_variance import sample_score_std

# Correct, but drawing in another order than the reference (per trial, q before its keys), with a
# plain-float divisor and np.float64 results: it passes only within Monte-Carlo tolerance.
SOLUTION = '''
import math
import numpy as np

DIVISORS = {"none": lambda d_k: 1.0, "sqrt": math.sqrt, "linear": float}


def divisor(d_k, scale):
    if scale not in DIVISORS:
        raise ValueError(f"unknown scale {scale!r}")
    return DIVISORS[scale](d_k)


def score_std(d_k, scale="sqrt"):
    return math.sqrt(d_k) / divisor(d_k, scale)


def sample_score_std(d_k, scale="sqrt", n_samples=10_000, seed=0):
    s = divisor(d_k, scale)
    rng = np.random.default_rng(seed)
    pairs = rng.standard_normal((n_samples, 2, d_k))
    return np.std(np.einsum("nd,nd->n", pairs[:, 0], pairs[:, 1]) / s)


def mean_max_weight(d_k, n_keys=16, scale="sqrt", n_trials=2_000, seed=0):
    s = divisor(d_k, scale)
    rng = np.random.default_rng(seed)
    best = []
    for _ in range(n_trials):
        q = rng.standard_normal(d_k)
        k = rng.standard_normal((n_keys, d_k))
        scores = k @ q / s
        w = np.exp(scores - scores.max())
        best.append(w.max() / w.sum())
    return np.mean(best)
'''


def test_floats_and_np_float64_pass_the_type_check_and_nothing_else():
    for ok in (1.0, np.float64(1.0)):
        check_float(ok, call="score_std(64)")
    for bad in (np.array(1.0), np.array([1.0]), np.float32(1.0), 1, True, "1.0", None):
        with pytest.raises(CheckFailed, match="must be a float"):
            check_float(bad, call="score_std(64)")


def test_std_rtol_is_seven_standard_errors_of_the_reference_scatter():
    # 200 independent sample stds over 2_000 draws scatter by std_rtol / 7, to within the 15 % (3
    # standard errors) that 200 of them can tell; the kurtosis term matters at d_k = 4 (about 20 %).
    for d_k in (4, 16):
        stds = [sample_score_std(d_k, "sqrt", 2_000, seed) for seed in range(200)]
        assert abs(np.std(stds, ddof=1) / (std_rtol(d_k, 2_000) / 7) - 1) < 0.15


def test_weight_tolerance_covers_other_seeds_and_not_other_scales():
    bugs = Bugs(find("scaling-variance"))
    expected, atol = weight_case(bugs, 16, 16, "sqrt", 2_000, seed=1)
    others = [weight_case(bugs, 16, 16, "sqrt", 2_000, seed)[0] for seed in range(2, 12)]
    assert max(abs(o - expected) for o in others) < atol / 2
    for scale in ("none", "linear"):
        assert abs(weight_case(bugs, 16, 16, scale, 2_000, seed=1)[0] - expected) > 3 * atol


def test_a_solution_drawing_in_another_order_passes(grade_source):
    result = grade_source("scaling-variance", SOLUTION, seed=5)
    assert result["status"] == "passed", [c["message"] for c in result["checks"] if c["status"] != "passed"]


def test_none_and_sqrt_swapped_is_scale_mixup_and_a_dict_lookup_raises_key_error(grade_source):
    # A swap the scale-mixup oracle (sqrt <-> linear) does not make: named by the other-scale rule.
    source = SOLUTION.replace('"none": lambda d_k: 1.0, "sqrt": math.sqrt',
                              '"none": math.sqrt, "sqrt": lambda d_k: 1.0')
    source = source.replace('    if scale not in DIVISORS:\n        raise ValueError(f"unknown scale {scale!r}")\n', "")
    result = grade_source("scaling-variance", source)
    checks = checks_by_id(result)
    for check in ("score-std-exact", "sample-score-std-close", "mean-max-weight-matches-reference",
                  "unscaled-saturates", "sqrt-stays-flat"):
        assert checks[check]["diagnosis"] == "scale-mixup", check
    assert "got: d_k 4: 0.2" in checks["unscaled-saturates"]["message"]   # the "sqrt" values: flat
    assert checks["linear-goes-uniform"]["status"] == "passed"
    assert "raised KeyError" in checks["unknown-scale-raises"]["message"]
    assert result["diagnoses"] == ["scale-mixup"]


def test_np_var_is_variance_not_std_and_an_unseeded_generator_is_not_reproducible(grade_source):
    source = SOLUTION.replace("return np.std(", "return np.var(").replace(
        "mean_max_weight(d_k, n_keys=16, scale=\"sqrt\", n_trials=2_000, seed=0):\n    s = divisor(d_k, scale)\n"
        "    rng = np.random.default_rng(seed)",
        "mean_max_weight(d_k, n_keys=16, scale=\"sqrt\", n_trials=2_000, seed=0):\n    s = divisor(d_k, scale)\n"
        "    rng = np.random.default_rng()")
    checks = checks_by_id(grade_source("scaling-variance", source))
    assert checks["sample-score-std-close"]["diagnosis"] == "variance-not-std"
    assert "sample_score_std(16, 'none'" in checks["sample-score-std-close"]["message"]
    assert "not within 5.4% of the analytic std" in checks["sample-score-std-close"]["message"]
    assert checks["unknown-scale-raises"]["status"] == "passed"   # wrong values, yet unknown scales raise
    message = checks["seeded-draws-reproducible"]["message"]
    assert message.startswith("The same seed gave two different floats") and "mean_max_weight(16, 16" in message
    assert checks["mean-max-weight-matches-reference"]["status"] == "passed"
    assert checks["score-std-exact"]["status"] == "passed"


def test_arrays_global_draws_ignored_n_keys_and_a_silent_default(grade_source):
    source = SOLUTION.replace("return math.sqrt(d_k) / divisor(d_k, scale)",
                              "return np.sqrt(np.float32(d_k)) / divisor(d_k, scale)")
    source = source.replace("raise ValueError(f\"unknown scale {scale!r}\")", "scale = \"sqrt\"")
    source = source.replace("pairs = rng.standard_normal(", "pairs = np.random.standard_normal(")
    source = source.replace("k = rng.standard_normal((n_keys, d_k))", "k = rng.standard_normal((16, d_k))")
    checks = checks_by_id(grade_source("scaling-variance", source))
    message = checks["score-std-exact"]["message"]
    assert message.startswith("The result must be a float") and "got: float32 np.float32(8.0)" in message
    # np.random's global state is reseeded before every call: reproducible, but blind to the seed.
    assert checks["sample-score-std-close"]["status"] == "passed"
    assert checks["seeded-draws-reproducible"]["message"].startswith("Two different seeds gave the same float")
    message = checks["mean-max-weight-matches-reference"]["message"]
    assert "not within Monte-Carlo tolerance" in message and "against 8 keys" in message
    assert checks["mean-max-weight-matches-reference"]["diagnosis"] is None
    assert checks["linear-goes-uniform"]["status"] == "failed"
    assert checks["sqrt-stays-flat"]["status"] == "passed"
    assert "not fall back to some scale" in checks["unknown-scale-raises"]["message"]


def test_unknown_scale_raises_judges_only_that_property(grade_source):
    # Every value wrong (the variance, scales swapped), every unknown scale refused with ValueError.
    source = SOLUTION.replace('"sqrt": math.sqrt, "linear": float', '"sqrt": float, "linear": math.sqrt').replace(
        "return math.sqrt(d_k) / divisor(d_k, scale)", "return d_k / divisor(d_k, scale) ** 2")
    checks = checks_by_id(grade_source("scaling-variance", source))
    assert checks["unknown-scale-raises"]["status"] == "passed"
    assert checks["score-std-exact"]["status"] == "failed" and checks["sample-score-std-close"]["status"] == "failed"
    # Raising ValueError for every scale does not tell unknown names apart.
    source = SOLUTION.replace("    if scale not in DIVISORS:\n", "    if True:\n")
    check = checks_by_id(grade_source("scaling-variance", source))["unknown-scale-raises"]
    assert check["status"] == "failed" and "raised ValueError" in check["message"]


def test_defaults_other_than_the_api_fail_seeded_draws_reproducible(grade_source):
    for old, new in (("n_samples=10_000, seed=0", "n_samples=10_000, seed=1"),
                     ("def mean_max_weight(d_k, n_keys=16", "def mean_max_weight(d_k, n_keys=17")):
        result = grade_source("scaling-variance", SOLUTION.replace(old, new))
        check = checks_by_id(result)["seeded-draws-reproducible"]
        assert [c["id"] for c in result["checks"] if c["status"] != "passed"] == ["seeded-draws-reproducible"]
        assert "with its defaults spelled out differ" in check["message"]


def test_scores_of_the_right_std_that_are_not_dot_products_fail_only_that_check(grade_source):
    # sum(q) has std sqrt(d_k) like q·k: only the spread of its sample std over seeds tells them apart.
    source = SOLUTION.replace('return np.std(np.einsum("nd,nd->n", pairs[:, 0], pairs[:, 1]) / s)',
                              "return np.std(pairs[:, 0].sum(axis=-1) / s)")
    result = grade_source("scaling-variance", source)
    assert [c["id"] for c in result["checks"] if c["status"] != "passed"] == ["scores-are-dot-products"]
    assert "do not look like dot products" in checks_by_id(result)["scores-are-dot-products"]["message"]


@pytest.mark.parametrize("shift", ["scores.min()", "0.0"])
def test_a_softmax_that_overflows_at_huge_d_k_fails_unscaled_saturates_only(grade_source, shift):
    """Subtracting the row's min (or nothing) is exact at the d_k of the trend, and NaN at d_k = 2**19."""
    overflowing = SOLUTION.replace("np.exp(scores - scores.max())", f"np.exp(scores - {shift})")
    result = grade_source("scaling-variance", overflowing, seed=5)
    failed = {c["id"]: c["message"] for c in result["checks"] if c["status"] != "passed"}
    assert list(failed) == ["unscaled-saturates"]
    assert "overflowed for huge unscaled scores" in failed["unscaled-saturates"]
