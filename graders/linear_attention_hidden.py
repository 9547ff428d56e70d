"""Hidden checks of the linear-attention kata: fresh values at each grading, never in a student bundle."""
from graders.linear_attention import STEPPED, check_attention, check_chunked, check_steps, qkv, trusted_decode


def fresh_sizes(case_rng):
    """(B, H, d, dv): H != d, and dv != d so that S and its transpose differ in shape."""
    h = int(case_rng.integers(2, 5))
    d = int(case_rng.choice([n for n in range(3, 8) if n != h]))
    return int(case_rng.integers(2, 4)), h, d, d + int(case_rng.integers(1, 4))


def test_fresh_parallel_forms(learner, bugs, kata, case_rng, rng, device):
    """another batch, heads, widths and lengths: causal and non-causal linear_attention equal the reference"""
    b, h, d, dv = fresh_sizes(case_rng)
    T = int(case_rng.integers(5, 13))
    q, k, v = qkv(rng, T, T, b=b, h=h, d=d, dv=dv)
    check_attention(learner, bugs, kata, device, q, k, v, True, bugs.reference.linear_attention(q, k, v, causal=True),
                    against="the reference, in float64")
    q, k, v = qkv(rng, int(case_rng.integers(2, 6)), T, b=b, h=h, d=d, dv=dv)
    check_attention(learner, bugs, kata, device, q, k, v, False, bugs.reference.linear_attention(q, k, v, causal=False),
                    against="the reference, in float64")


def test_fresh_decode(learner, bugs, kata, case_rng, rng, device):
    """another state handed in and another stream: every out and state (S, z) of linear_attention_step equal the reference's"""
    check_steps(learner, bugs, kata, rng, device, int(case_rng.integers(2, 9)), int(case_rng.integers(3, 7)),
                sizes=fresh_sizes(case_rng))


def test_fresh_chunked(learner, bugs, kata, case_rng, rng, device):
    """another batch, heads, widths, length, chunk size and decay: linear_attention_chunked equals the reference's steps"""
    b, h, d, dv = fresh_sizes(case_rng)
    T = int(case_rng.integers(7, 15))
    C = int(case_rng.integers(2, T // 3 + 1))   # three chunks or more: the state is carried at least twice
    gamma = float(case_rng.choice([0.6, 0.85, 0.95]))
    q, k, v = qkv(rng, T, T, b=b, h=h, d=d, dv=dv)
    want = trusted_decode(bugs.reference.linear_attention_step, q, k, v, None, gamma)[0]
    check_chunked(learner, bugs, kata, device, q, k, v, C, gamma, want, against=STEPPED)
