"""Hidden checks of the causal-mask kata: fresh inputs at each grading, never in a student bundle."""
from graders.causal_mask import (B, D, DV, H, check_attention, check_mask_type, diagnose_attention, mask_call,
                                 qkv, randn, tensors_case)
from graders.engine import expect


def test_future_perturbation_leaves_past_unchanged(learner, bugs, kata, rng, device):
    """perturbing future inputs leaves earlier outputs unchanged (your causal_mask with your masked_attention)"""
    tol = kata.tolerance("float64")
    for tq, tk in ((6, 6), (5, 9)):
        mask = learner.causal_mask(tq, tk)
        check_mask_type(mask, (tq, tk), call=mask_call(tq, tk), device="cpu")   # device=None: the default device
        q, k, v = qkv(rng, (B, H), tq, tk)
        call = f"masked_attention(q, k, v, mask={mask_call(tq, tk)})"
        result = learner.masked_attention(q, k, v, mask=mask)
        # Judged with the learner's own mask: whether that mask is right is the other checks' business.
        check_attention(result, bugs.reference.masked_attention(q, k, v, mask), call=call, tol=tol, device=device,
                        case=tensors_case(q, k, v, mask, "the mask is what your causal_mask returned"),
                        diagnose=lambda: diagnose_attention(bugs, result, q, k, v, mask, tol))
        for t in range(tq - 1):
            future = tk - tq + t + 1   # keys from this position on are later than query t
            q2, k2, v2 = q.clone(), k.clone(), v.clone()
            q2[..., t + 1:, :] = randn(rng, B, H, tq - t - 1, D)
            k2[..., future:, :] = randn(rng, B, H, tk - future, D)
            v2[..., future:, :] = randn(rng, B, H, tk - future, DV)
            case = f"{tq} queries, {tk} keys; q after query {t} and k, v from key {future} on redrawn"
            result2 = learner.masked_attention(q2, k2, v2, mask=mask)
            check_attention(result2, bugs.reference.masked_attention(q2, k2, v2, mask), call=call, case=case, tol=tol,
                            device=device, diagnose=lambda: diagnose_attention(bugs, result2, q2, k2, v2, mask, tol))
            problem = expect.mismatch(result2[0][..., :t + 1, :], result[0][..., :t + 1, :], **tol)
            earlier = "query 0" if t == 0 else f"queries 0..{t}"
            expect.that(problem is None, f"Changing only inputs later than query {t} changed the output of {earlier}: "
                        "your causal mask lets a query see the future.", call=call, case=case,
                        got=problem, expected=f"the output of {earlier} unchanged",
                        diagnose=lambda: bugs.match(result[0], lambda impl: impl.masked_attention(
                            q, k, v, impl.causal_mask(tq, tk))[0], **tol))
