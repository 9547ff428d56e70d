"""Grader of the scaling-variance kata (katas/scaling-variance/README.md).

Two of the three functions are Monte-Carlo estimates, and the kata does not fix the order in which
they draw. So they are judged within tolerances derived from their sample sizes, wide enough that
a correct estimate never fails by chance (7 and 6 standard errors) and far narrower than what any
wrong formula changes (a factor of sqrt(d_k) >= 4 on the std; 0.1 or more on a max weight).
"""
import numpy as np

from graders.engine import expect
from graders.engine.failures import LearnerRaised
from graders.engine.learner import call_text, describe_value

SCALES = ("none", "sqrt", "linear")
DIVISOR = {"none": "1", "sqrt": "sqrt(d_k)", "linear": "d_k"}
TREND_D_KS = (4, 32, 512)
TREND_TRIALS = 1_000
SEED_RANGE = 2**31


def seeds(case_rng, n):
    return [int(s) for s in case_rng.choice(SEED_RANGE, n, replace=False)]


def divisor(d_k, scale) -> str:
    return DIVISOR[scale].replace("d_k", str(d_k))


def check_float(got, *, call, case=None):
    """A float: np.float64 is a float subclass and passes; arrays, np.float32, ints, None do not."""
    shown = describe_value(got) if isinstance(got, np.ndarray) else f"{type(got).__name__} {describe_value(got)}"
    expect.that(isinstance(got, float), "The result must be a float (np.float64 is accepted too).",
                call=call, case=case, got=shown, expected="a float, e.g. `return float(np.std(scores))`")


def close(a, b, tol) -> bool:
    return expect.mismatch(a, b, **tol) is None


def diagnose(bugs, got, compute, scale, tol):
    """The bug oracle whose output is ``got``; failing that, scale-mixup when ``got`` is the right
    answer for another scale (a swap the oracle does not make, such as "none" <-> "sqrt").
    ``compute(impl, scale)`` runs the call on an implementation: the reference or a bug."""
    code = bugs.match(got, lambda impl: compute(impl, scale), **tol)
    ref = bugs.reference
    right = compute(ref, scale)
    if code is None and any(close(got, compute(ref, other), tol) and not close(right, compute(ref, other), tol)
                            for other in SCALES if other != scale):
        return "scale-mixup"
    return code


# --- score_std -----------------------------------------------------------------------------------

def check_score_std(got, d_k, scale, *, call, bugs, tol):
    check_float(got, call=call)
    expected = bugs.reference.score_std(d_k, scale)
    expect.that(close(got, expected, tol), "score_std differs from the analytic std of q·k / s.",
                call=call, case=f"d_k = {d_k}, scale {scale!r}: s = {DIVISOR[scale]}", got=repr(float(got)),
                expected=f"{expected!r} = sqrt({d_k}) / {divisor(d_k, scale)}: q·k sums {d_k} products of "
                         f"variance 1, so its std is sqrt({d_k})",
                diagnose=lambda: diagnose(bugs, got, lambda impl, sc: impl.score_std(d_k, sc), scale, tol))


def test_score_std_exact(learner, bugs, kata):
    """score_std is sqrt(d_k) / s exactly, for every scale"""
    tol = kata.tolerance("float64")
    for d_k in (64, 2, 16, 100, 512):
        for scale in SCALES:
            check_score_std(learner.score_std(d_k, scale), d_k, scale, bugs=bugs, tol=tol,
                            call=call_text("score_std", (d_k, scale), {}))
    check_score_std(learner.score_std(64), 64, "sqrt", bugs=bugs, tol=tol, call="score_std(64)")


# --- sample_score_std ----------------------------------------------------------------------------

def std_rtol(d_k, n_samples):
    """7 standard errors of a sample std of q·k / s over n draws, relative to the std.

    q·k sums d_k products q_i k_i of variance 1 and fourth moment 9, so its kurtosis is 3 + 6 / d_k.
    A sample variance has relative standard error sqrt((kurtosis - 1) / n), a sample std half that.
    At n = 10_000 this is the kata's 5 % (5.4 % at d_k = 16, 5.1 % at d_k = 64): a correct estimate
    fails with probability about 3e-12, while a wrong scale or a variance is off by sqrt(d_k) >= 4.
    """
    return 7 * np.sqrt((2 + 6 / d_k) / n_samples) / 2


def check_sample(got, d_k, scale, n_samples, *, call, case, bugs):
    check_float(got, call=call, case=case)
    expected, rtol = bugs.reference.score_std(d_k, scale), std_rtol(d_k, n_samples)
    # An oracle's analytic value is what a sample with that bug lands near. A sample variance
    # has twice the relative standard error of a sample std: match oracles within 2 rtol.
    expect.that(close(got, expected, dict(rtol=rtol, atol=0.0)),
                f"sample_score_std is not within {rtol:.1%} of the analytic std.", call=call, case=case,
                got=repr(float(got)),
                expected=f"{expected:.6g} = sqrt({d_k}) / {divisor(d_k, scale)}, within {rtol:.1%} "
                         f"(7 standard errors of a sample std over {n_samples} draws)",
                diagnose=lambda: diagnose(bugs, got, lambda impl, sc: impl.score_std(d_k, sc), scale,
                                          dict(rtol=2 * rtol, atol=0.0)))


def test_sample_score_std_close(learner, bugs, case_rng):
    """sample_score_std lands within 5 % (7 standard errors) of sqrt(d_k) / s"""
    cases = [(d_k, scale, 10_000) for d_k in (16, 64) for scale in SCALES] + [(256, "linear", 10_000),
                                                                                (64, "none", 40_000)]
    for (d_k, scale, n_samples), seed in zip(cases, seeds(case_rng, len(cases))):
        call = call_text("sample_score_std", (d_k, scale, n_samples, seed), {})
        check_sample(learner.sample_score_std(d_k, scale, n_samples, seed), d_k, scale, n_samples,
                     call=call, case="q, k with i.i.d. N(0, 1) entries", bugs=bugs)
    check_sample(learner.sample_score_std(64), 64, "sqrt", 10_000, call="sample_score_std(64)",
                 case="the defaults: scale 'sqrt', 10_000 samples, seed 0", bugs=bugs)


def check_same_seed(first, again, different, *, call, other_call):
    """``again`` repeats the call that gave ``first``; ``different`` is the call with another seed."""
    check_float(again, call=call)
    check_float(different, call=other_call)
    expect.that(again == first, "The same seed gave two different floats: draw from "
                "`np.random.default_rng(seed)`, not from an unseeded generator.", call=f"{call}, twice",
                got=f"{first!r}, then {again!r}", expected="the same float twice")
    expect.that(different != first, "Two different seeds gave the same float: the seed is ignored. Draw from "
                "`np.random.default_rng(seed)`, not from np.random's global functions.",
                call=f"{call}, then {other_call}", got=f"{first!r} both times", expected="two different floats")


def test_seeded_draws_reproducible(learner, bugs, case_rng):
    """a seed gives the same float every time, another seed another float, and the defaults answer as spelled out"""
    seed, other = seeds(case_rng, 2)
    call, other_call = (call_text("sample_score_std", (32, "sqrt", 10_000, s), {}) for s in (seed, other))
    first = learner.sample_score_std(32, "sqrt", 10_000, seed)
    check_sample(first, 32, "sqrt", 10_000, call=call, case="q, k with i.i.d. N(0, 1) entries", bugs=bugs)
    check_same_seed(first, learner.sample_score_std(32, "sqrt", 10_000, seed),
                    learner.sample_score_std(32, "sqrt", 10_000, other), call=call, other_call=other_call)
    call, other_call = (call_text("mean_max_weight", (16, 16, "sqrt", 1_000, s), {}) for s in (seed, other))
    first = call_weight(learner, bugs, 16, 16, "sqrt", 1_000, seed)
    check_same_seed(first, learner.mean_max_weight(16, 16, "sqrt", 1_000, seed),
                    learner.mean_max_weight(16, 16, "sqrt", 1_000, other), call=call, other_call=other_call)
    # The defaults are part of the API, and a seed fixes the float: a default call must answer
    # exactly what the call spelling the defaults out answers (a default seed of 1 or 9_999 samples
    # lands within Monte-Carlo tolerance of the reference, never on the same float).
    for name, args in (("sample_score_std", (64, "sqrt", 10_000, 0)), ("mean_max_weight", (64, 16, "sqrt", 2_000, 0))):
        member = getattr(learner, name)
        default, spelled = member(64), member(*args)
        expect.that(default == spelled, f"{name}(64) and {name} with its defaults spelled out differ: the "
                    "defaults must be " + ("scale 'sqrt', n_samples 10_000, seed 0." if name == "sample_score_std"
                                           else "n_keys 16, scale 'sqrt', n_trials 2_000, seed 0."),
                    call=f"{name}(64), then {call_text(name, args, {})}",
                    got=f"{default!r}, then {spelled!r}", expected="the same float twice")


def test_scores_are_dot_products(learner, case_rng):
    """the samples are dot products q·k: at d_k = 1 their sample std scatters as a product of two normals' does"""
    # Only a product's shape can tell q·k from another variable of the same std (a sum of the
    # entries of q, say). A sample std over n draws of kurtosis κ has variance about (κ - 1) / (4 n)
    # of its square mean: at d_k = 1 a score q₁k₁ has κ = 9 (2 / n), a normal has κ = 3 (0.5 / n).
    # Over 300 seeds the log of that relative variance has standard deviation about
    # sqrt(2 / 299) = 0.082, and log 2 = 0.69 (8 of them) separates each value from the threshold
    # 1 / n, their geometric mean: a correct sampler fails with a probability far below 1e-9.
    n_samples, n_seeds = 1_000, 300
    stds = np.array([learner.sample_score_std(1, "none", n_samples, seed) for seed in seeds(case_rng, n_seeds)], float)
    spread = np.var(stds, ddof=1) / np.mean(stds) ** 2
    expect.that(spread > 1 / n_samples,
                "Your samples do not look like dot products q·k: at d_k = 1 a score is the product of two "
                "independent normals, whose heavy tails make its sample std scatter over seeds twice as much "
                "as a normal variable's.", call=f"sample_score_std(1, 'none', {n_samples}, seed) for {n_seeds} seeds",
                got=f"relative variance of the {n_seeds} sample stds {spread:.3g}",
                expected=f"about {2 / n_samples:g} for q·k (a normal score gives {0.5 / n_samples:g}); above "
                         f"{1 / n_samples:g}")


# --- mean_max_weight -----------------------------------------------------------------------------

def weight_case(bugs, d_k, n_keys, scale, n_trials, seed):
    """The reference's mean max weight for this call, and how far a correct estimate may land from it.

    A correct estimate drawn in another order is independent of the reference's: their difference
    has standard error sqrt(2) σ / sqrt(n_trials), σ being the std of one trial's max weight (taken
    from the reference's trials). 6 of them: a correct answer fails with probability 2e-9.
    """
    trials = bugs.reference._max_weights(d_k, n_keys, scale, n_trials, seed)
    return float(np.mean(trials)), 6 * np.sqrt(2) * float(np.std(trials, ddof=1)) / np.sqrt(n_trials) + 1e-12


def diagnose_weights(bugs, got, d_ks, n_keys, scale, n_trials, seed):
    """Which bug gives these mean max weights (one per d_k). Every scale's Monte-Carlo tolerance
    counts, since a mixed-up scale's estimate scatters like the scale it really uses."""
    atol = max(weight_case(bugs, d_k, n_keys, sc, n_trials, seed)[1] for d_k in d_ks for sc in SCALES)
    return diagnose(bugs, got, lambda impl, sc: [impl.mean_max_weight(d_k, n_keys, sc, n_trials, seed) for d_k in d_ks],
                    scale, dict(rtol=0.0, atol=atol))


def check_weight(got, d_k, n_keys, scale, n_trials, seed, *, call, bugs):
    check_float(got, call=call)
    expected, atol = weight_case(bugs, d_k, n_keys, scale, n_trials, seed)
    expect.that(close(got, expected, dict(rtol=0.0, atol=atol)),
                "mean_max_weight is not within Monte-Carlo tolerance of the reference.", call=call,
                case=f"{n_trials} trials of one query against {n_keys} keys, scale {scale!r}: s = {DIVISOR[scale]}",
                got=repr(float(got)),
                expected=f"{expected:.4f} ± {atol:.4f} (6 standard errors of two independent means of "
                         f"{n_trials} trials)",
                diagnose=lambda: diagnose_weights(bugs, [got], [d_k], n_keys, scale, n_trials, seed))


def call_weight(learner, bugs, d_k, n_keys, scale, n_trials, seed):
    call = call_text("mean_max_weight", (d_k, n_keys, scale, n_trials, seed), {})
    got = learner.mean_max_weight(d_k, n_keys, scale, n_trials, seed)
    check_weight(got, d_k, n_keys, scale, n_trials, seed, call=call, bugs=bugs)
    return got


def test_mean_max_weight_matches_reference(learner, bugs, case_rng):
    """mean_max_weight is within Monte-Carlo tolerance of the reference"""
    cases = [(8, 16, "none", 2_000), (64, 8, "sqrt", 1_000), (64, 32, "linear", 2_000), (16, 16, "sqrt", 2_000),
             (16, 8, "linear", 2_000), (64, 32, "none", 1_000)]
    for (d_k, n_keys, scale, n_trials), seed in zip(cases, seeds(case_rng, len(cases))):
        call_weight(learner, bugs, d_k, n_keys, scale, n_trials, seed)
    check_weight(learner.mean_max_weight(64), 64, 16, "sqrt", 2_000, 0, call="mean_max_weight(64)", bugs=bugs)


def trend(learner, bugs, case_rng, n_keys, scale, holds, message, expected):
    """mean_max_weight over TREND_D_KS; ``holds(values)`` is the trend the scale must show."""
    seed = seeds(case_rng, 1)[0]
    calls = [(d_k, n_keys, scale, TREND_TRIALS, seed) for d_k in TREND_D_KS]
    got = [learner.mean_max_weight(*args) for args in calls]
    for value, args in zip(got, calls):
        check_float(value, call=call_text("mean_max_weight", args, {}))
    expect.that(holds(got), message, call=f"mean_max_weight(d_k, {n_keys}, {scale!r}, {TREND_TRIALS}, {seed})",
                case=f"d_k = {', '.join(map(str, TREND_D_KS))}",
                got=", ".join(f"d_k {d}: {v:.4f}" for d, v in zip(TREND_D_KS, got)), expected=expected,
                diagnose=lambda: diagnose_weights(bugs, got, TREND_D_KS, n_keys, scale, TREND_TRIALS, seed))
    for value, args in zip(got, calls):
        check_weight(value, *args, call=call_text("mean_max_weight", args, {}), bugs=bugs)


def test_unscaled_saturates(learner, bugs, case_rng):
    """with scale "none" the max weight rises towards 1 with d_k (>= 0.9 at d_k = 512), and stays finite at d_k = 2**19"""
    # Reference: about 0.43, 0.78, 0.945; 6 standard errors of one estimate over 1_000 trials are
    # at most 0.041 (0.022 at d_k = 512, so a correct answer clears 0.9).
    trend(learner, bugs, case_rng, 16, "none", lambda w: w[0] < w[1] < w[2] and w[2] >= 0.9,
          "Unscaled scores have std sqrt(d_k): as d_k grows one key takes nearly all the weight, so the "
          "mean max weight must rise with d_k and reach 0.9 by d_k = 512.",
          "rising with d_k, >= 0.9 at d_k = 512 (the softmax saturates)")
    # At d_k = 2**19 unscaled scores have std 724 and a row spans ~1,500: exp of anything but
    # scores minus the row's max overflows (exp(710) is inf in float64) and the weights turn NaN.
    # 4 trials of 4 keys draw 67 MB. A max weight always lies in [1 / n_keys, 1].
    d_k, n_keys, n_trials, seed = 2**19, 4, 4, seeds(case_rng, 1)[0]
    call = call_text("mean_max_weight", (d_k, n_keys, "none", n_trials, seed), {})
    got = learner.mean_max_weight(d_k, n_keys, "none", n_trials, seed)
    check_float(got, call=call)
    expect.that(1 / n_keys <= got <= 1, "The softmax overflowed for huge unscaled scores: subtract each row's max "
                "before exp.", call=call, case="d_k = 2**19: scores spread over thousands", got=repr(got),
                expected=f"a mean max weight in [1/{n_keys}, 1]")


def test_linear_goes_uniform(learner, bugs, case_rng):
    """with scale "linear" the max weight falls towards 1 / n_keys"""
    # Reference with 8 keys: about 0.227, 0.159, 0.133 against 1 / 8 = 0.125; 6 standard errors of
    # one estimate are at most 0.013 (0.0006 at d_k = 512).
    n_keys = 8
    trend(learner, bugs, case_rng, n_keys, "linear", lambda w: w[0] > w[1] > w[2] and w[2] <= 1.15 / n_keys,
          "Scores divided by d_k have std 1 / sqrt(d_k), which shrinks to 0: the softmax turns uniform, "
          f"so the mean max weight must fall with d_k towards 1 / n_keys = {1 / n_keys:g}.",
          f"falling with d_k, <= 1.15 / n_keys = {1.15 / n_keys:.4f} at d_k = 512")


# --- unknown scales ------------------------------------------------------------------------------

def check_raises_value_error(member, args, label):
    call = call_text(label, args, {})
    try:
        got = member(*args)
    except LearnerRaised as exc:
        if exc.type_name is None:
            raise
        expect.that(exc.type_name == "ValueError", "An unknown scale must raise ValueError.", call=call,
                    got=exc.message.splitlines()[0],
                    expected="ValueError, e.g. `raise ValueError(f\"unknown scale {scale!r}\")`")
        return
    expect.fail("An unknown scale must raise ValueError, not fall back to some scale.", call=call,
                got=f"returned {describe_value(got)}", expected="ValueError")


def test_unknown_scale_raises(learner, case_rng):
    """an unknown scale raises ValueError in all three functions"""
    seed = seeds(case_rng, 1)[0]
    for bad in ("log", "d_k"):
        check_raises_value_error(learner.score_std, (8, bad), "score_std")
        check_raises_value_error(learner.sample_score_std, (8, bad, 1_000, seed), "sample_score_std")
        check_raises_value_error(learner.mean_max_weight, (8, 8, bad, 500, seed), "mean_max_weight")
    # Raising for every scale is not telling unknown names apart: the known ones must return,
    # whatever they return (the value checks judge that).
    for scale in SCALES:
        learner.score_std(8, scale)
        learner.sample_score_std(8, scale, 1_000, seed)
        learner.mean_max_weight(8, 8, scale, 500, seed)
