"""Hidden checks of the mha-by-loop kata: fresh values at each grading, never in a student bundle."""
from graders.engine import expect
from graders.mha_by_loop import CALL, CONFIGS, build, case_text, diagnosis, expected, guarded, normal, weights
from graders.mha_by_loop import learner  # noqa: F401  (the given class for a file that holds only mha_by_loop)


def fresh_config(case_rng):
    """(B, T, C, H) drawn from case_rng, with H != head_dim as in the public configs."""
    H = int(case_rng.integers(2, 7))
    hd = int(case_rng.choice([n for n in range(3, 9) if n != H]))
    return int(case_rng.integers(2, 4)), int(case_rng.integers(4, 12)), H * hd, H


def test_float32_matches_module(learner, bugs, kata, case_rng, rng, device):
    """float32 in, float32 out, within atol 1e-5 of the module"""
    tol = kata.tolerance("float32")
    for B, T, C, H in (CONFIGS[0], fresh_config(case_rng)):
        sd = {k: v.float() for k, v in weights(rng, C).items()}
        x = normal(rng, B, T, C).float()
        case = case_text(x, H)
        got = guarded(lambda: learner.mha_by_loop(build(learner, device, sd, H), x), C, call=CALL, case=case)
        expect.array(got, expected(bugs, sd, H, x), call=CALL, case=case, device=device, what="the output",
                     against="the module's forward (computed in float64)",
                     diagnose=lambda: diagnosis(bugs, got, sd, H, x, tol), **tol)
