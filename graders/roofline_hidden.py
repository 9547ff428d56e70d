"""Hidden checks of the roofline kata: fresh values at each grading, never in a student bundle."""
import math
from fractions import Fraction

from graders.engine import expect
from graders.roofline import call_text, step_diagnosis, step_of, tie


def test_bound_flips_at_crossover(learner, bugs, case_rng):
    """decode_step's bound turns from memory to compute at crossover_batch, for other hardware numbers"""
    # The hardware decides which batches are tried (the crossover's floor, and whether it is 0):
    # structure, drawn from case_rng.
    hbm = float(case_rng.uniform(1.0, 8.0)) * 1e12
    fps = float(case_rng.uniform(100.0, 2000.0)) * 1e12
    bpp = float(case_rng.choice([0.5, 1, 2, 4]))
    P = int(case_rng.integers(10**8, 10**11))
    kvt = int(case_rng.integers(10**4, 10**6))
    exact = Fraction(fps) * Fraction(bpp) / (2 * Fraction(hbm))   # the crossover, exactly
    below, above = math.floor(exact), math.floor(exact) + 1   # at a tie (below == exact) the bound is "memory"
    case = f"hbm_bytes_per_s = {hbm:g}, flops_per_s = {fps:g}, {bpp:g} bytes per parameter, an empty cache"
    for B, expected in ((below, "memory"), (above, "compute")):
        if B < 1:
            continue
        args = (P, kvt, 0, B, hbm, fps, bpp)
        call = call_text("decode_step", args)
        got = step_of(learner, args, call=call, case=case)
        expect.that(got[1] == expected, f"With an empty cache the weight matmuls decide the bound: the crossover is "
                    f"{float(exact):.6g} sequences.{tie(args)}", call=call, case=case, got=repr(got[1]),
                    expected=repr(expected), diagnose=lambda: step_diagnosis(learner, bugs, got, args))
    # The cache keeps a large batch memory-bound: T chosen so that its bytes outweigh the FLOPs' time.
    B = 4 * above
    T = math.ceil(2 * P * B * hbm / fps / (B * kvt)) + 1
    args = (P, kvt, T, B, hbm, fps, bpp)
    call = call_text("decode_step", args)
    got = step_of(learner, args, call=call, case=f"{case.removesuffix(', an empty cache')}, {T:,} tokens cached each")
    expect.that(got[1] == "memory", "Above the crossover batch, a long enough cache still makes the step memory-bound: "
                "every sequence reads its own.", call=call, got=repr(got[1]), expected="'memory'",
                diagnose=lambda: step_diagnosis(learner, bugs, got, args))
