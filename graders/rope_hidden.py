"""Hidden checks of the rope kata: fresh values at each grading, never in a student bundle."""
import torch

from graders.engine import expect
from graders.rope import KIT_PAIRS, decode, normal, table, weights


def test_apply_rope_at_fresh_positions(learner, bugs, kata, case_rng, rng, device):
    """apply_rope at another head_dim, base and positions (scattered, up to several thousand) equals the reference"""
    H = int(case_rng.integers(2, 5))
    hd = 2 * int(case_rng.choice([n for n in range(4, 17) if 2 * n != H]))
    T = int(case_rng.integers(5, 12))
    base = float(case_rng.choice([500.0, 10000.0, 500000.0]))
    P = int(case_rng.integers(T + 50, 6000))
    pos = [int(p) for p in case_rng.choice(P, size=T, replace=False)]
    cos, sin = table(bugs, P, hd, base, torch.float64)
    x, positions = normal(rng, 2, H, T, hd), torch.tensor(pos)
    call = "apply_rope(x, cos, sin, positions)"
    case = (f"x: float64 (2, {H}, {T}, {hd}), standard normal; cos, sin = rope_cache({P}, {hd}, {base:g}) of the "
            f"reference; positions = {pos}; {KIT_PAIRS}")
    got = learner.apply_rope(x, cos, sin, positions)
    expect.array(got, bugs.reference.apply_rope(x, cos, sin, positions), call=call, case=case, what="the rotated x",
                 device=device, **kata.tolerance("float64"), float32_inside=expect.float32_inside(kata),
                 diagnose=lambda: bugs.match(got, lambda impl: impl.apply_rope(x, cos, sin, positions),
                                             **kata.tolerance("float32")))


def test_decode_in_fresh_chunks(learner, bugs, kata, case_rng, rng, device):
    """another configuration fed in other chunks with past_kv equals your module's own forward over the whole sequence"""
    H = int(case_rng.integers(2, 5))
    hd = 2 * int(case_rng.choice([n for n in range(2, 9) if 2 * n != H]))
    T = int(case_rng.integers(6, 13))
    splits, left = [], T
    while left:
        size = min(left, int(case_rng.choice([1, 1, 2, 3])) if splits else int(case_rng.integers(1, T // 2 + 1)))
        splits.append(size)
        left -= size
    decode(learner, bugs, kata, device, weights(rng, H * hd), H, normal(rng, 2, T, H * hd), splits)
