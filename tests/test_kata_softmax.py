"""The softmax grader on solutions written the way learners write them (not via the bug oracles),
and the tolerance it derives from the dtype and the logits' magnitude."""
import numpy as np

from conftest import checks_by_id
from graders.engine.manifest import find
from reference.softmax import softmax as reference

# The log-sum-exp form, in float32 at x + 1000: off by a relative 2.8e-5, one rounding of 1000.
LSE = '''
import numpy as np


def softmax(x, axis=-1):
    m = np.max(x, axis, keepdims=True)
    return np.exp(x - (m + np.log(np.sum(np.exp(x - m), axis, keepdims=True))))
'''


def lse(x, axis):
    m = np.max(x, axis, keepdims=True)
    return np.exp(x - (m + np.log(np.sum(np.exp(x - m), axis, keepdims=True))))


def test_the_log_sum_exp_form_errs_by_one_rounding_of_the_largest_logit():
    kata = find("softmax")
    x = (np.random.default_rng(0).standard_normal((4, 7)) + 1000).astype(np.float32)
    got, expected = lse(x, -1), reference(x.astype(np.float64), -1).astype(np.float32)
    assert np.abs(got / expected - 1).max() > kata.tolerances["float32"]["rtol"]   # the dtype alone refuses it
    tol = kata.tolerance("float32", np.abs(x).max())
    assert np.allclose(got, expected, **tol)
    assert tol["atol"] < 0.01 * expected.min()   # and the grown atol is still far below every weight


def test_the_log_sum_exp_form_gets_full_marks_and_fails_without_the_magnitude_term(grade_source):
    result = grade_source("softmax", LSE)
    assert result["status"] == "passed" and result["score"] == result["max_score"]
    kata = find("softmax")
    dtype_only = {dtype: {k: v for k, v in tol.items() if k != "ulps"} for dtype, tol in kata.tolerances.items()}
    checks = checks_by_id(grade_source("softmax", LSE, tolerances=dtype_only))
    assert checks["stable-for-large-logits"]["status"] == "failed"
    assert "float32 x + 1000" in checks["stable-for-large-logits"]["message"]


def test_wrong_values_that_leave_the_input_alone_pass_the_property_checks(grade_source):
    # Normalises exp(x) by its max instead of its sum: wrong values, no library call, no write into x.
    source = LSE.replace("return np.exp(x - (m + np.log(np.sum(np.exp(x - m), axis, keepdims=True))))",
                         "return np.exp(x - m)")
    checks = checks_by_id(grade_source("softmax", source))
    assert checks["input-not-modified"]["status"] == "passed"
    assert checks["banned-api"]["status"] == "passed"
    for check in ("matches-reference", "sums-to-one", "stable-for-large-logits", "dtype-preserved"):
        assert checks[check]["status"] == "failed", check


def test_writing_into_the_input_fails_only_input_not_modified(grade_source):
    source = '''
import numpy as np


def softmax(x, axis=-1):
    x -= np.max(x, axis=axis, keepdims=True)
    np.exp(x, out=x)
    x /= np.sum(x, axis=axis, keepdims=True)
    return x
'''
    result = grade_source("softmax", source)
    checks = checks_by_id(result)
    assert [c["id"] for c in result["checks"] if c["status"] != "passed"] == ["input-not-modified"]
    assert "wrote into its input" in checks["input-not-modified"]["message"]


def test_an_axis_default_other_than_minus_one_fails_matches_reference(grade_source):
    source = LSE.replace("def softmax(x, axis=-1)", "def softmax(x, axis=1)")
    checks = checks_by_id(grade_source("softmax", source))
    assert checks["matches-reference"]["status"] == "failed"
    assert "softmax(x)" in checks["matches-reference"]["message"]


def test_a_library_softmax_fails_banned_api_whatever_its_values(grade_source):
    source = '''
import torch


def softmax(x, axis=-1):
    return torch.softmax(torch.from_numpy(x), dim=axis).numpy()
'''
    result = grade_source("softmax", source)
    checks = checks_by_id(result)
    assert checks["banned-api"]["status"] == "failed" and checks["banned-api"]["diagnosis"] == "banned-api"
    assert checks["matches-reference"]["status"] == "passed"



def test_float64_for_float32_input_fails_only_the_dtype_check_and_is_named_there(grade_source):
    # np.asarray(x, dtype=float): right values, float64 whatever comes in. The value checks judge
    # the values within float32's tolerance; the dtype is one failure, named.
    source = LSE.replace("    m = np.max(", "    x = np.asarray(x, dtype=float)\n    m = np.max(")
    result = grade_source("softmax", source)
    checks = checks_by_id(result)
    assert {c["id"]: c["diagnosis"] for c in result["checks"] if c["status"] != "passed"} == {
        "dtype-preserved": "dtype-not-preserved"}
    assert "got: float64" in checks["dtype-preserved"]["message"]
    assert result["score"] == result["max_score"] - 1


def test_float32_for_float64_input_is_no_dtype_not_preserved(grade_source):
    # The other way round the values lose float64's precision, and the diagnosis, which names
    # float64 coming in and staying, does not fire.
    source = LSE.replace("    m = np.max(", "    x = x.astype(np.float32)\n    m = np.max(")
    result = grade_source("softmax", source)
    checks = checks_by_id(result)
    assert checks["dtype-preserved"]["status"] == "failed" and checks["dtype-preserved"]["diagnosis"] is None
    assert checks["matches-reference"]["status"] == "failed"
    assert "dtype-not-preserved" not in result["diagnoses"]
