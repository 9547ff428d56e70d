"""Hidden checks of the split-heads kata: fresh values at each grading, never in a student bundle."""
import torch

from graders.engine import expect
from graders.split_heads import RUNS, merge, randn, x_case


def fresh_run(case_rng):
    """(B, T, C, H, dtype) drawn from case_rng, with H != hd as in the public runs."""
    H = int(case_rng.integers(2, 6))
    hd = int(case_rng.choice([n for n in range(2, 9) if n != H]))
    return int(case_rng.integers(2, 5)), int(case_rng.integers(3, 10)), H * hd, H, torch.float64


def test_roundtrip(learner, bugs, kata, case_rng, rng, device):
    """merge_heads(split_heads(x)) == x, and scaling head h in between scales channels h*hd:(h+1)*hd"""
    for B, T, C, H, dtype in [*RUNS, fresh_run(case_rng)]:
        tol = kata.tolerance(dtype)
        x = randn(rng, B, T, C, dtype=dtype)
        case = x_case(B, T, C, H, dtype)
        heads = learner.split_heads(x, H)
        # What split_heads returned goes back to merge_heads as it is: contiguous, like att @ v.
        expect.type_of(heads, torch.Tensor, call=f"split_heads(x, {H})", case=case)
        expect.that(tuple(heads.shape) == (B, H, T, C // H), "split_heads returned the wrong shape.",
                    call=f"split_heads(x, {H})", case=case, got=f"shape {tuple(heads.shape)}",
                    expected=f"shape {(B, H, T, C // H)} = (B, H, T, hd)")
        back = merge(learner, heads, case=case + "; merging what split_heads returned")
        expect.array(back, x, call=f"merge_heads(split_heads(x, {H}))", case=case, device=device,
                     what="merge_heads(split_heads(x))", against="x",
                     diagnose=lambda: bugs.match(back, lambda impl: impl.merge_heads(impl.split_heads(x, H)), **tol),
                     **tol)
        # The heads must be the channel blocks, not merely an invertible shuffle of x.
        scale = torch.arange(1, H + 1, dtype=dtype)[:, None, None]   # (H, 1, 1)
        scaled_case = case + "; head h multiplied by h + 1 between the two calls"
        scaled = merge(learner, heads.to("cpu") * scale, case=scaled_case)
        expected = x * scale.flatten().repeat_interleave(C // H)   # (B, T, C): block h times h + 1
        expect.array(scaled, expected, call=f"merge_heads(split_heads(x, {H}) * (h + 1))", case=scaled_case,
                     device=device, what="merge_heads(heads * (h + 1))", against="x with channels h*hd:(h+1)*hd "
                     "times h + 1",
                     diagnose=lambda: bugs.match(scaled, lambda impl: impl.merge_heads(impl.split_heads(x, H) * scale),
                                                 **tol), **tol)
