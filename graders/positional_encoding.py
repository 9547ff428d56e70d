"""Grader of the positional-encoding kata (katas/positional-encoding/README.md)."""
import torch
import torch.nn.functional as F

from graders.engine import expect
from graders.engine.failures import sentence

# (T, d): d/2 >= 3 pairs, so i/d against 2i/d, halves against pairs and sin against cos all show
# from position 1 on; T != d, so a transposed table has the wrong shape. (1, 8) is position 0
# alone, (200, 32) phases up to 199.
PE_CASES = [(64, 16), (10, 6), (1, 8), (200, 32)]
# (k, d): forwards, backwards, a shift longer than a period of the fastest pair, and k = 0 (the
# identity, last: there every frequency bug looks right).
SHIFT_CASES = [(3, 16), (-5, 16), (17, 8), (0, 6)]
# Powers of two and not: 12 = 8 + 4, 6 = 4 + 2 and 20 = 16 + 4 take the paper's interleaved slopes.
SLOPE_HEADS = [8, 12, 6, 1, 32, 20]
# (n_heads, T): 8 heads first (the slopes right for every bug but the power-of-two one), then 12.
BIAS_CASES = [(8, 10), (12, 7), (4, 1)]
# (B, n_heads, T, head_dim) of the attention the bias is added to; n_heads != head_dim != T.
ATTENTION_CASES = [(2, 12, 9, 4), (3, 8, 16, 5)]
PE_CASE = ("positions 0..{last}, d = {d}: PE[p, 2i] = sin(p·ω_i), PE[p, 2i+1] = cos(p·ω_i), ω_i = 10000^(-2i/d); "
           "phases up to {last}")


def pe_tolerance(kata, T):
    """float32's tolerance for a table whose phases p·ω reach T - 1: each is rounded, and its
    sine with it, by up to a few ulps of T - 1."""
    return kata.tolerance("float32", magnitude=max(T - 1, 0))


def shift_tolerance(kata, k):
    """M_k's entries are cos and sin of phases k·ω_i, up to |k|."""
    return kata.tolerance("float32", magnitude=abs(k))


def bias_tolerance(kata, bias):
    """A bias of magnitude max|bias| (its finite entries) may be off by a few of its float32 ulps."""
    return kata.tolerance("float32", magnitude=expect.magnitude(bias))


def slope_tolerance(kata, H):
    """Slopes span 2^-8 to 2^-0.5: relative error only, an absolute one would swamp the smallest.
    A power of a float32 base rounded once (BLOOM's torch.pow(base, i)) is off by up to i·eps/2 at
    head i, so rtol grows with H by the ulps the table's atol grows by with T."""
    base = kata.tolerance("float32")
    return {"rtol": base["rtol"] + kata.tolerance("float32", magnitude=H)["atol"] - base["atol"], "atol": 0.0}


def finfo_fill(got, expected):
    """(H, T, T) bool: where ``expected`` is -inf (above the diagonal) and ``got`` holds
    torch.finfo(float32).min instead. Hugging Face's masks fill with the dtype's minimum, which
    gives those keys weight exactly 0 as -inf does (exp underflows): either is the causal bias.
    None when ``got`` is no float32 tensor of ``expected``'s shape (the form checks judge that)."""
    if type(got) is not torch.Tensor or got.dtype != torch.float32 or tuple(got.shape) != tuple(expected.shape):
        return None
    return expected.isneginf() & (got.detach().cpu() == torch.finfo(torch.float32).min)


def as_filled(t, where, value):
    """``t`` with ``value`` at ``where`` (a CPU bool mask), on ``t``'s device."""
    return t if where is None else torch.where(where.to(t.device), torch.tensor(value, device=t.device), t)


def attend(q, k, v, bias):
    """softmax(q kᵀ / sqrt(head_dim) + bias) v in q's dtype: F.scaled_dot_product_attention adds a
    float attn_mask to the scaled scores, so the attention is an oracle nobody here wrote."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.device, q.dtype))   # (B, H, T, hd)


def randn(rng, *shape):
    return torch.from_numpy(rng.standard_normal(shape))


def table_form(got, shape, *, call, case=None, what="the table"):
    """A plain floating tensor of ``shape``: what a property of the learner's own answer needs."""
    expect.form(got, torch.Tensor, shape, call=call, case=case, what=what)
    expect.that(got.is_floating_point(), f"{sentence(what)} must hold floating-point values.",
                call=call, case=case, got=str(got.dtype), expected="torch.float32")


def test_sinusoidal_values(learner, bugs, kata):
    """sinusoidal(T, d) is the (T, d) float32 table: sin in the even columns, cos in the odd ones, ω_i = 10000^(-2i/d)"""
    for T, d in PE_CASES:
        tol = pe_tolerance(kata, T)
        got = learner.sinusoidal(T, d)
        expect.array(got, bugs.reference.sinusoidal(T, d), call=f"sinusoidal({T}, {d})",
                     case=PE_CASE.format(last=T - 1, d=d), what="the table",
                     against="the table computed in float64 and rounded to float32",
                     diagnose=lambda: bugs.match(got, lambda impl: impl.sinusoidal(T, d), **tol), **tol)


def test_rejects_odd_d(learner):
    """an odd d raises ValueError (or AssertionError) in sinusoidal and shift_matrix: the encoding is made of pairs"""
    learner.sinusoidal(4, 6)   # valid calls first: only an odd d may raise
    learner.shift_matrix(1, 6)
    for call, make in (("sinusoidal(4, 7)", lambda: learner.sinusoidal(4, 7)),
                       ("shift_matrix(1, 7)", lambda: learner.shift_matrix(1, 7))):
        case = "d = 7: three (sin, cos) pairs and one column left over"
        wanted = "ValueError (or AssertionError) saying that d must be even"
        expect.refused(make, call=call, case=case, expected=wanted,
                       raised="An odd d failed somewhere inside instead of being refused: check d % 2 yourself first.",
                       returned="An odd d cannot be split into (sin, cos) pairs, yet a result came back.")


def test_shift_matrix_values(learner, bugs, kata):
    """shift_matrix(k, d) is block-diagonal: pair i of M_k turns (sin, cos) by k·ω_i, for k > 0, k < 0 and k = 0"""
    for k, d in SHIFT_CASES:
        tol = shift_tolerance(kata, k)
        got = learner.shift_matrix(k, d)
        case = (f"d = {d}, k = {k}: block i is [[cos kω_i, sin kω_i], [-sin kω_i, cos kω_i]], so that "
                "PE[p + k] = PE[p] @ M_k.T")
        expect.array(got, bugs.reference.shift_matrix(k, d), call=f"shift_matrix({k}, {d})", case=case, what="M_k",
                     against="the rotation computed in float64 and rounded to float32",
                     diagnose=lambda: bugs.match(got, lambda impl: impl.shift_matrix(k, d), **tol), **tol)


def test_alibi_slopes(learner, bugs, kata):
    """alibi_slopes(H): 2^(-8i/H) for a power of two, the paper's interleaved slopes otherwise (H = 8, 12, 6, 1, 32, 20)"""
    for H in SLOPE_HEADS:
        tol = slope_tolerance(kata, H)
        n = 1 << (H.bit_length() - 1)
        case = (f"{H} heads: 2^(-8i/{H}) for i = 1..{H}" if n == H else
                f"{H} heads: the {n} slopes of {n} heads, then alibi_slopes({2 * n})[0::2][:{H - n}]")
        got = learner.alibi_slopes(H)
        expect.array(got, bugs.reference.alibi_slopes(H), call=f"alibi_slopes({H})", case=case, what="the slope tensor",
                     diagnose=lambda: bugs.match(got, lambda impl: impl.alibi_slopes(H), **tol), **tol)


def test_alibi_bias_values(learner, bugs, kata):
    """alibi_bias(H, T) is (H, T, T) float32: -slope_h·(i - j) for keys j <= i, -inf (or float32's finfo.min) above the diagonal"""
    for H, T in BIAS_CASES:
        expected = bugs.reference.alibi_bias(H, T)
        tol = bias_tolerance(kata, expected)
        got = learner.alibi_bias(H, T)
        case = (f"{H} heads, {T} positions: bias[h, i, j] = -slope_h·(i - j) for j <= i, -inf (or "
                "torch.finfo(torch.float32).min) for j > i")
        # Where the learner filled finfo.min above the diagonal, that is what is expected there; the
        # oracles fill -inf, so they are asked about the bias with those entries read as -inf.
        fill = finfo_fill(got, expected)
        accepted = as_filled(expected, fill, torch.finfo(torch.float32).min)
        causal = as_filled(got, fill, float("-inf"))
        expect.array(got, accepted, call=f"alibi_bias({H}, {T})", case=case, what="the bias",
                     diagnose=lambda: bugs.match(causal, lambda impl: impl.alibi_bias(H, T), **tol), **tol)


def test_attention_with_alibi_bias(learner, bugs, kata, rng):
    """causal attention with your bias added to the scaled scores equals attention with the reference's"""
    # Only what attention makes of the bias: a constant added to a whole query row changes nothing.
    for B, H, T, hd in ATTENTION_CASES:
        q, k, v = randn(rng, B, H, T, hd), randn(rng, B, H, T, hd), randn(rng, B, H, T, hd)
        bias = learner.alibi_bias(H, T)
        mask_call = f"alibi_bias({H}, {T})"
        call = f"F.scaled_dot_product_attention(q, k, v, attn_mask={mask_call})"
        case = (f"q, k, v float64 ({B}, {H}, {T}, {hd}) standard normal: softmax(q kᵀ / sqrt({hd}) + bias) v, "
                "your bias against the reference's")
        table_form(bias, (H, T, T), call=mask_call, case=case, what="the bias")
        reference = bugs.reference.alibi_bias(H, T)
        # Rounding a score s moves the output by up to ~2|s|·eps·max|v|: the bias's ulps, times max|v|.
        tol = kata.tolerance("float32", magnitude=2 * expect.magnitude(reference) * expect.magnitude(v))
        out = attend(q, k, v, bias)
        expect.values(out, attend(q, k, v, reference), call=call, case=case, what="the attention output",
                      against="the same attention with the reference's bias",
                      diagnose=lambda: bugs.match(out, lambda impl: attend(q, k, v, impl.alibi_bias(H, T)), **tol),
                      **tol)
