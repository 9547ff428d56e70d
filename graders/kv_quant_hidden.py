"""Hidden checks of the kv-quant kata: fresh values at each grading, never in a student bundle."""
from graders.kv_quant import E4M3, INT8, fill, judge_cache, ops_text


def test_decodes_token_by_token(learner, bugs, kata, case_rng, rng):
    """a prefill, then tokens decoded one at a time, each attending over the whole quantized cache, in int8 and in e4m3"""
    # case_rng draws the structure (the same at every seed); rng the values (fresh at each).
    for dtype in (INT8, E4M3):
        B, H = int(case_rng.integers(1, 3)), int(case_rng.integers(2, 4))
        d, prefill = int(case_rng.integers(5, 9)), int(case_rng.integers(4, 8))
        schedule = [("append", prefill)] + [op for _ in range(4) for op in (("append", 1), ("attend", 1))]
        ops = fill(rng, dtype, B, H, d, schedule)
        judge_cache(learner, bugs, kata, dtype, ops,
                    f"QuantKVCache({dtype}); keys, values, queries float32 (B, H, T, d) = ({B}, {H}, T, {d}), "
                    f"standard normal; {ops_text(ops)}")
