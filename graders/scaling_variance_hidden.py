"""Hidden checks of the scaling-variance kata: fresh values at each grading, never in a student bundle."""
from graders.scaling_variance import trend


def test_sqrt_stays_flat(learner, bugs, case_rng):
    """with scale "sqrt" the max weight stays roughly flat in d_k"""
    # Reference: about 0.238, 0.245, 0.247 (16 keys). At 6 standard errors of their difference two
    # estimates stay within 0.04 of each other: a ratio under 1.2.
    trend(learner, bugs, case_rng, 16, "sqrt", lambda w: max(w) <= 1.25 * min(w),
          "Scores divided by sqrt(d_k) have std 1 whatever d_k is, so the mean max weight must stay "
          "roughly flat: the largest of the three within 25 % of the smallest.",
          "values within 25 % of each other")
