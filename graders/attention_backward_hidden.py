"""Hidden checks of the attention-backward kata: fresh values at each grading, never in a student bundle."""
import torch

from graders.attention_backward import (call_text, diagnosis, graded, inputs, probabilities, randn, run,
                                        shapes_text, triple_form)
from graders.engine import expect


def fresh_config(case_rng, tall=False):
    """(B, H, Tq, Tk, hd, dv) drawn from case_rng, with H != hd and every T >= 5 as in the public configs;
    ``tall``: Tq > Tk, so that the causal mask leaves the first queries before every key (there a
    top-left mask differs from the bottom-right one, and a row without a key must not be NaN)."""
    H = int(case_rng.integers(2, 5))
    hd = int(case_rng.choice([n for n in range(5, 9) if n != H]))   # no public check's head width (3, 4)
    B = int(case_rng.integers(2, 4))
    if tall:
        Tk = int(case_rng.integers(5, 9))
        Tq = int(case_rng.integers(Tk + 1, 10))
    else:
        Tq, Tk = int(case_rng.integers(5, 10)), int(case_rng.integers(5, 10))
    return B, H, Tq, Tk, hd, int(case_rng.integers(3, 8))


def test_fresh_inputs(learner, bugs, kata, case_rng, rng, device):
    """(dq, dk, dv) equal autograd's on other shapes, scales and masks"""
    for causal in (False, True):   # the default scale once, a drawn one once
        scale = round(float(rng.uniform(0.2, 1.5)), 3) if causal else None
        graded(learner, bugs, kata, device, *inputs(rng, fresh_config(case_rng, tall=causal)), scale=scale, causal=causal)


def test_gradients_sum_to_zero(learner, bugs, kata, case_rng, rng, device):
    """rows of softmax_backward's ds and dk over the keys sum to 0: shifting a row of scores, or every key, changes no softmax"""
    tol, loose = kata.tolerance("float64"), kata.tolerance("float32")
    B, H, Tq, Tk, hd, dv = fresh_config(case_rng, tall=True)
    p, dp = probabilities(rng, B, H, Tq, Tk), randn(rng, B, H, Tq, Tk)
    got = learner.softmax_backward(p, dp)
    call = "softmax_backward(p, dp)"
    case = f"p {(B, H, Tq, Tk)} = softmax(2·z) along the last axis, dp standard normal"
    expect.form(got, torch.Tensor, (B, H, Tq, Tk), dtype=torch.float64, device=device, call=call, case=case)
    rows = got.sum(-1)
    expect.values(rows, torch.zeros_like(rows), call=f"{call}.sum(-1)", case=case,
                  what="each row sum of ds (softmax(s + c) = softmax(s): moving a whole row of scores moves nothing)",
                  against="0",
                  diagnose=lambda: bugs.match(got, lambda impl: impl.softmax_backward(p, dp), **loose),
                  float32_inside=expect.float32_inside(kata), **tol)
    for causal in (False, True):
        q, k, v, do = inputs(rng, (B, H, Tq, Tk, hd, dv))
        call, case = call_text(causal=causal), shapes_text(q, k, v, do)
        grads = run(learner, q, k, v, do, causal=causal)
        triple_form(grads, q, k, v, device=device, call=call, case=case)
        total = grads[1].sum(-2)
        expect.values(total, torch.zeros_like(total), call=f"{call}[1].sum(-2)", case=case,
                      what="dk summed over the keys (adding one vector c to every key adds q·c to a whole row of scores)",
                      against="0",
                      diagnose=lambda: diagnosis(bugs, grads, q, k, v, do, loose, causal=causal),
                      float32_inside=expect.float32_inside(kata), **tol)
