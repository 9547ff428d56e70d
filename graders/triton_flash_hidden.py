"""Hidden checks of the triton-flash kata: fresh values at each grading, never in a student bundle."""
from graders.triton_flash import attend, case_text, inputs


def test_fresh_shapes_match_sdpa(learner, bugs, kata, case_rng, rng, device):
    """out equals F.scaled_dot_product_attention on shapes and block sizes no public check shows, causal and not"""
    # case_rng draws the structure (the same at every seed); rng the values (fresh at each).
    for causal in (False, True):
        B, H = (int(n) for n in case_rng.integers(1, 3, size=2))
        T = int(case_rng.integers(17, 41))
        D = int(case_rng.choice([16, 32]))
        bm = int(case_rng.choice([16, 32]))
        q, k, v = inputs(rng, B, H, T, D)
        attend(learner, bugs, kata, q, k, v, causal, bm, 16, case_text(B, H, T, D), device)
