"""Hidden checks of the gqa kata: fresh values at each grading, never in a student bundle."""
import torch

from graders.engine import expect
from graders.gqa import CASE, CONFIGS, build, compare, normal, output_form, trusted, weights


def test_mqa_single_kv_head(learner, bugs, kata, case_rng, rng, device):
    """n_kv_heads == 1 (multi-query attention): every query head shares one KV head"""
    H = int(case_rng.integers(2, 7))   # a (B, T, d, H) of its own, with H != head_dim as in the public configs
    d = H * int(case_rng.choice([n for n in range(3, 9) if n != H]))
    B, T = int(case_rng.integers(2, 4)), int(case_rng.integers(5, 10))
    for causal in (True, False):
        compare(learner, bugs, kata, rng, device, (B, T, d, H, 1), causal)


def test_causal_ignores_future(learner, bugs, kata, rng, device):
    """causal=True (the default): changing later tokens leaves earlier outputs unchanged; the first token sees only itself"""
    B, T, d, H, Hkv = CONFIGS[0]
    t0, hd = 3, d // H
    tol = kata.tolerance("float64")
    sd, x = weights(rng, d, H, Hkv), normal(rng, B, T, d)
    x_new = x.clone()
    x_new[:, t0:] = normal(rng, B, T - t0, d)
    call = f"GroupedQueryAttention({d}, {H}, {Hkv})(x, causal=True)"
    case = CASE.format(dtype="float64", B=B, T=T, d=d, H=H, Hkv=Hkv) + f"; then tokens {t0}..{T - 1} of x redrawn; eval mode"
    m = build(learner, device, sd, H, Hkv)
    before, after = m(x, causal=True), m(x_new, causal=True)
    for got in (before, after):
        output_form(got, B=B, T=T, d=d, dtype=torch.float64, device=device, call=call, case=case)
    diagnose = lambda: bugs.match((before, after), lambda impl: tuple(
        trusted(impl.GroupedQueryAttention, sd, H, Hkv, xs, True) for xs in (x, x_new)), **kata.tolerance("float32"))
    problem = expect.mismatch(after[:, :t0], before[:, :t0], **tol)
    expect.that(problem is None, f"With causal=True, changing tokens {t0}..{T - 1} changed the output at positions "
                f"0..{t0 - 1}: the future leaks into the past.", call=call, case=case,
                got=f"the output at positions 0..{t0 - 1} changed: {problem}",
                expected="those outputs unchanged: query i may only attend to keys j <= i", diagnose=diagnose)
    # Token 0 may attend only to itself, so each head's output is its own KV head's value of token 0.
    v0 = (x[:, 0] @ sd["v_proj.weight"].T).view(B, Hkv, hd)   # (B, Hkv, hd)
    first = v0[:, [j // (H // Hkv) for j in range(H)]].reshape(B, d) @ sd["o_proj.weight"].T   # (B, d)
    problem = expect.mismatch(before[:, 0], first, **tol)
    expect.that(problem is None, "With causal=True, the first token may attend only to itself, so its output must "
                "be o_proj of its own values, query head j taking KV head j // (n_heads // n_kv_heads).",
                call=call, case=case, got=f"the output at position 0: {problem}",
                expected="out[:, 0] = o_proj(the values of token 0, query head j reading KV head j // n_rep)", diagnose=diagnose)
    # causal=True is forward's default: a decoder called as m(x) must not see the future either.
    default, call = m(x), call.replace(", causal=True", "")
    output_form(default, B=B, T=T, d=d, dtype=torch.float64, device=device, call=call, case=case)
    problem = expect.mismatch(default, before, **tol)
    expect.that(problem is None, "Called without `causal`, the module does not give its causal=True output: "
                "forward's default must be causal=True.", call=call, case=case,
                got=f"m(x) differs from m(x, causal=True): {problem}", expected="m(x) == m(x, causal=True)",
                diagnose=lambda: "no-causal-mask")
