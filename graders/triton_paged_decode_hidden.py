"""Hidden checks of the triton-paged-decode kata: fresh values at each grading, never in a student bundle."""
from graders.triton_paged_decode import judge, paged_case


def test_fresh_shapes(learner, bugs, kata, case_rng, rng):
    """groups of 3 query heads, head_dim 8, blocks of 8 slots, lengths no public check shows"""
    # case_rng draws the structure (the same at every seed); rng the values (fresh at each).
    seq_lens = tuple(int(n) for n in case_rng.integers(2, 24, size=2))
    judge(learner, bugs, kata, *paged_case(case_rng, rng, 2, 2, 3, 8, 8, seq_lens, 2, True))
