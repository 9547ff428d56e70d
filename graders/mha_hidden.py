"""Hidden checks of the mha kata: fresh values at each grading, never in a student bundle."""
import torch

from graders.engine import expect
from graders.mha import (CASE, CONFIGS, build, diagnosis, normal, pair_form, trusted, weights,
                         weights_diagnosis)


def fresh_config(case_rng):
    """(B, T, d_model, n_heads) drawn from case_rng, with n_heads != head_dim as in the public configs."""
    H = int(case_rng.integers(2, 5))
    hd = int(case_rng.choice([n for n in range(3, 8) if n != H]))
    return int(case_rng.integers(2, 4)), int(case_rng.integers(5, 10)), H * hd, H


def test_weights_sum_to_one(learner, bugs, kata, case_rng, rng, device):
    """each query's weights sum to 1 over the keys"""
    B, T, d, H = fresh_config(case_rng)
    tol = kata.tolerance("float64")
    for causal in (False, True):
        sd, x = weights(rng, d), normal(rng, B, T, d)
        call = f"MultiHeadSelfAttention({d}, {H})(x, causal={causal})"
        case = CASE.format(dtype="float64", B=B, T=T, d=d, H=H) + "; eval mode"
        got = build(learner, device, sd, H)(x, causal=causal)
        pair_form(got, B=B, T=T, d=d, H=H, dtype=torch.float64, device=device, call=call, case=case)
        sums = got[1].sum(-1)
        expect.values(sums, torch.ones_like(sums), call=f"{call}[1].sum(-1)", case=case,
                      what="each row sum of the weights", against="1", **tol, float32_inside=expect.float32_inside(kata),
                      diagnose=lambda: diagnosis(bugs, got, lambda impl: trusted(impl.MultiHeadSelfAttention, sd, H, x, causal),
                                                 tol, causal))


def test_causal_ignores_future(learner, bugs, kata, rng, device):
    """causal=True: changing later tokens leaves earlier outputs and weights unchanged"""
    B, T, d, H = CONFIGS[0]
    t0 = 3
    tol = kata.tolerance("float64")
    sd, x = weights(rng, d), normal(rng, B, T, d)
    x_new = x.clone()
    x_new[:, t0:] = normal(rng, B, T - t0, d)
    call = f"MultiHeadSelfAttention({d}, {H})(x, causal=True)"
    case = CASE.format(dtype="float64", B=B, T=T, d=d, H=H) + f"; then tokens {t0}..{T - 1} of x redrawn; eval mode"
    m = build(learner, device, sd, H)
    before, after = m(x, causal=True), m(x_new, causal=True)
    for got in (before, after):
        pair_form(got, B=B, T=T, d=d, H=H, dtype=torch.float64, device=device, call=call, case=case)

    def diagnose():
        compute = lambda impl: tuple(trusted(impl.MultiHeadSelfAttention, sd, H, xs, True) for xs in (x, x_new))
        return bugs.match((before, after), compute, **tol) or weights_diagnosis(before[1], True)

    for what, old, new in ((f"the output at positions 0..{t0 - 1}", before[0][:, :t0], after[0][:, :t0]),
                           (f"the weights of queries 0..{t0 - 1}", before[1][:, :, :t0], after[1][:, :, :t0])):
        problem = expect.mismatch(new, old, **tol)
        expect.that(problem is None, f"With causal=True, changing tokens {t0}..{T - 1} changed {what}: "
                    "the future leaks into the past.", call=call, case=case, got=f"{what} changed: {problem}",
                    expected=f"{what} unchanged: query i may only attend to keys j <= i",
                    diagnose=diagnose)
