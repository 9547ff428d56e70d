"""Hidden checks of the sdpa-swap kata: fresh values at each grading, never in a student bundle."""
from graders.sdpa_swap import BS, check_reference


def test_short_sequence(learner, bugs, kata, case_rng, rng, device):
    """T < block_size works on both paths: the mask is sliced to T"""
    check_reference(learner, bugs, kata, rng, device, T=int(case_rng.integers(5, BS)))   # 5 <= T < block_size
