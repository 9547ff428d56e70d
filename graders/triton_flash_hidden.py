"""Hidden checks of the triton-flash kata: fresh values at each grading, never in a student bundle."""
import torch
import triton
import triton.language as tl

from graders.triton_flash import judge


def test_other_shapes(learner, bugs, kata, case_rng, rng):
    """matches the reference on cases no public check shows"""
    # case_rng draws the structure (the same at every seed); rng the values (fresh at each).
    shape = tuple(int(n) for n in case_rng.integers(2, 7, size=3))
    judge(learner, bugs, kata, torch.from_numpy(rng.standard_normal(shape)), "hidden inputs")
