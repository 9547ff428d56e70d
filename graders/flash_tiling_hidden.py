"""Hidden checks of the flash-tiling kata: fresh values at each grading, never in a student bundle."""
from graders.engine import expect
from graders.flash_tiling import (call_text, case_text, diagnose_with, inputs, judge_lse, judge_out, normal,
                                  tensors, trusted)


def fresh_shape(case_rng, causal):
    """(B, H, Tq, Tk, head_dim, block_q, block_k) drawn from case_rng: B != H != head_dim, Tq <= Tk when
    causal, and blocks smaller than the sequences, so there are several tiles and ragged ones."""
    H = int(case_rng.integers(2, 5))
    B = int(case_rng.choice([b for b in (2, 3, 4) if b != H]))
    hd = int(case_rng.choice([n for n in range(3, 11) if n != H]))
    Tq, Tk = (int(t) for t in case_rng.integers(5, 33, size=2))
    if causal and Tq > Tk:
        Tq, Tk = Tk, Tq
    bq, bk = int(case_rng.integers(1, max(2, Tq // 2) + 1)), int(case_rng.integers(2, max(3, Tk // 2) + 1))
    return B, H, Tq, Tk, hd, bq, bk


def test_fresh_shapes_match_sdpa(learner, bugs, kata, case_rng, rng, device):
    """other shapes and tile sizes: out equals SDPA and lse torch.logsumexp, causal and not"""
    tol = kata.tolerance("float64")
    for causal in (False, True):
        B, H, Tq, Tk, hd, bq, bk = fresh_shape(case_rng, causal)
        q, k, v = inputs(rng, B, H, Tq, Tk, hd)
        call, case = call_text(bq, bk, causal), case_text(B, H, Tq, Tk, hd)
        got = learner.flash_attention(q, k, v, block_q=bq, block_k=bk, causal=causal)
        diagnose = diagnose_with(bugs, kata, got, q, k, v, bq, bk, causal)
        judge_out(got, q, k, v, causal, call=call, case=case, tol=tol, device=device, kata=kata, diagnose=diagnose)
        judge_lse(got, q, k, causal, call=call, case=case, tol=tol, device=device, kata=kata, diagnose=diagnose)


def test_causal_ignores_future(learner, bugs, kata, case_rng, rng, device):
    """causal=True: redrawing the keys and values after a query's position leaves its out and lse unchanged"""
    B, H, Tq, Tk, hd, bq, bk = fresh_shape(case_rng, True)
    # The redrawn keys start inside a key block, so a diagonal tile left unmasked lets one of them
    # into an earlier query's row.
    offset = Tk - Tq
    t0 = next(t for t in range(Tq - 1, 0, -1) if (offset + t) % bk)
    tol = kata.tolerance("float64")
    q, k, v = inputs(rng, B, H, Tq, Tk, hd)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, offset + t0:], v2[:, :, offset + t0:] = (normal(rng, B, H, Tk - offset - t0, hd) for _ in range(2))
    call = call_text(bq, bk, True)
    case = case_text(B, H, Tq, Tk, hd, about=f"then keys and values {offset + t0}..{Tk - 1} redrawn; queries "
                     f"0..{t0 - 1} sit at positions up to {offset + t0 - 1}")
    before = learner.flash_attention(q, k, v, block_q=bq, block_k=bk, causal=True)
    after = learner.flash_attention(q, k2, v2, block_q=bq, block_k=bk, causal=True)
    diagnose = lambda: bugs.match((before, after), lambda impl: tuple(
        trusted(impl.flash_attention, q, kk, vv, bq, bk, True) for kk, vv in ((k, v), (k2, v2))),
        **kata.tolerance("float32"))
    for got in (before, after):
        tensors(got, call=call, case=case, diagnose=diagnose)
        for what, value, shape in (("the output", got[0], (B, H, Tq, hd)), ("lse", got[1], (B, H, Tq))):
            expect.form(value, type(q), shape, call=call, case=case, what=what)
    for i, what in enumerate(("the output", "lse")):
        old, new = before[i], after[i]
        problem = expect.mismatch(new[:, :, :t0], old[:, :, :t0], **tol)
        expect.that(problem is None, f"With causal=True, redrawing keys {offset + t0}..{Tk - 1} changed {what} of "
                    f"queries 0..{t0 - 1}: the future leaks into the past.", call=call, case=case,
                    got=f"{what} of queries 0..{t0 - 1} changed: {problem}",
                    expected=f"unchanged: query i sees keys 0..{offset} + i only", diagnose=diagnose)
