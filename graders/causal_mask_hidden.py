"""Hidden checks of the causal-mask kata: fresh values at each grading, never in a student bundle."""
import torch

from graders.causal_mask import B, D, DV, H, mask_call, pair_form, qkv, randn, tolerances
from graders.engine import expect


def output_of(result, *, call, case, shape):
    """The output of an ``(out, weights)`` pair, a tensor of ``shape``: all that this property needs."""
    pair_form(result, call=call, case=case)
    out = result[0]
    expect.type_of(out, torch.Tensor, call=call, case=case, what="the output")
    expect.that(tuple(out.shape) == shape, "The output has the wrong shape.", call=call, case=case,
                got=f"shape {tuple(out.shape)}", expected=f"shape {shape}")
    return out


def test_future_perturbation_leaves_past_unchanged(learner, bugs, kata, rng):
    """perturbing future inputs leaves earlier outputs unchanged (your causal_mask with your masked_attention)"""
    # Only this property, judged on what your code answers: whether the answers are the right values
    # is the value checks' business (a causal attention with a wrong scale is still causal).
    for tq, tk in ((6, 6), (5, 9)):
        mask = learner.causal_mask(tq, tk)
        expect.bool_mask(mask, (tq, tk), call=mask_call(tq, tk), device="cpu")   # device=None: the default device
        q, k, v = qkv(rng, (B, H), tq, tk)
        tol, loose = tolerances(kata, q.dtype)
        call = f"masked_attention(q, k, v, mask={mask_call(tq, tk)})"
        case = f"q, k, v float64 standard normal, {tq} queries, {tk} keys; the mask is what your causal_mask returned"
        result = learner.masked_attention(q, k, v, mask=mask)
        out = output_of(result, call=call, case=case, shape=(B, H, tq, DV))
        for t in range(tq - 1):
            future = tk - tq + t + 1   # keys from this position on are later than query t
            q2, k2, v2 = q.clone(), k.clone(), v.clone()
            q2[..., t + 1:, :] = randn(rng, B, H, tq - t - 1, D)
            k2[..., future:, :] = randn(rng, B, H, tk - future, D)
            v2[..., future:, :] = randn(rng, B, H, tk - future, DV)
            case = f"{tq} queries, {tk} keys; q after query {t} and k, v from key {future} on redrawn"
            out2 = output_of(learner.masked_attention(q2, k2, v2, mask=mask), call=call, case=case, shape=out.shape)
            problem = expect.mismatch(out2[..., :t + 1, :], out[..., :t + 1, :], **tol)
            earlier = "query 0" if t == 0 else f"queries 0..{t}"
            expect.that(problem is None, f"Changing only inputs later than query {t} changed the output of {earlier}: "
                        "your causal mask lets a query see the future.", call=call, case=case,
                        got=problem, expected=f"the output of {earlier} unchanged",
                        diagnose=lambda: bugs.match(out, lambda impl: impl.masked_attention(
                            q, k, v, impl.causal_mask(tq, tk))[0], **loose))
            # An output that ignores its inputs keeps the past too, and would pass for nothing.
            expect.that(expect.mismatch(out2[..., -1, :], out[..., -1, :], **tol) is not None,
                        f"Redrawing the inputs after query {t} left the output of the last query as it was: "
                        "an output that does not depend on q, k and v shows nothing about the mask.",
                        call=call, case=case, got="the last query's output unchanged",
                        expected="the last query's output changed: its query is redrawn")
