"""Hidden checks of the triton-softmax kata: fresh values at each grading, never in a student bundle."""
from graders.triton_softmax import judge, normal, strided


def test_fresh_shapes(learner, bugs, kata, case_rng, rng):
    """equals the reference on shapes no public check shows, packed and strided"""
    # case_rng draws the structure (the same at every seed); rng the values (fresh at each).
    R = int(case_rng.integers(2, 7))
    C = int(case_rng.choice([9, 17, 23, 47, 70]))
    judge(learner, bugs, kata, normal(rng, (R, C)) * 3, f"hidden inputs: float32 ({R}, {C})")
    stride = C + int(case_rng.integers(1, 6))
    judge(learner, bugs, kata, strided(rng, R, C, stride), f"hidden inputs: float32 ({R}, {C}), row stride {stride}")
