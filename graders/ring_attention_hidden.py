"""Hidden checks of the ring-attention kata: fresh values at each grading, never in a student bundle."""
import torch

from graders.ring_attention import Ring


def test_fresh_shapes_float32(learner, bugs, kata, case_rng, rng):
    """float32 chunks of other sizes (an odd T_local at 2 ranks, zig-zag at 4) equal the single-process attention"""
    # case_rng draws the structure (the same at every seed); rng the values (fresh at each).
    B, H = (int(n) for n in case_rng.integers(1, 4, size=2))
    for world, T, zigzag in ((2, 7, False), (4, 10, True)):
        d = int(case_rng.integers(3, 9))
        ring = Ring(bugs, kata, rng, world, (B, H, T, d), True, zigzag, dtype=torch.float32)
        ring.judge(ring.run(learner.ranks(world)))
