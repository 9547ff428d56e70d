"""Hidden checks of the cross-attention kata: fresh values at each grading, never in a student bundle."""
import torch

from graders.engine import expect
from graders.cross_attention import (TORCH_MHA, build, call_text, case_text, causal_diagnosis, diagnosis,
                                     forward, inputs, judge, lengths_text, normal, padding, pair, pair_form,
                                     torch_mha, trusted, weights)


def fresh_config(case_rng, Tq, Tk):
    """(B, Tq, Tk, d_model, n_heads, None, None) drawn from case_rng, with B != n_heads != head_dim as in the
    public configs, and the defaults kdim = vdim = d_model."""
    H = int(case_rng.integers(2, 5))
    hd = int(case_rng.choice([n for n in range(3, 8) if n != H]))
    B = int(case_rng.choice([b for b in (2, 3) if b != H]))
    return B, Tq, Tk, H * hd, H, None, None


def test_self_attention_special_case(learner, bugs, kata, case_rng, rng, device):
    """self-attention is the special case key = value = query: m(x, x, x) is the mha kata's fused-QKV module, padding mask or not"""
    T = int(case_rng.integers(5, 10))
    cfg = fresh_config(case_rng, T, T)
    B, _, _, d, H, _, _ = cfg
    loose = kata.tolerance("float32")
    for padded in (False, True):
        sd, x = weights(rng, d, d, d), normal(rng, B, T, d)
        kpm = padding(case_rng, B, T) if padded else None
        call = call_text(cfg, kpm).replace("(query, key, value", "(x, x, x")
        case = (f"x: float64 ({B}, {T}, {d}), standard normal, passed as query, key and value; n_heads={H}; weights "
                "injected (W ~ N(0, 1/d), b ~ N(0, 0.25))"
                + ("" if kpm is None else f"; key_padding_mask: {lengths_text(kpm)}") + "; eval mode")
        got = forward(build(learner, device, sd, cfg), x, x, x, kpm)
        pair(got, call=call, case=case)
        # nn.MultiheadAttention(d_model, n_heads) keeps one in_proj_weight [W_q; W_k; W_v]: the
        # mha kata's qkv_proj, the fused self-attention this module must reduce to.
        expected = torch_mha(sd, H, x, x, x, kpm)
        compute = lambda impl: trusted(impl.MultiHeadAttention, sd, H, x, x, x, kpm, defaults=True)
        diagnose = lambda: diagnosis(bugs, got, compute, loose, kpm=kpm, Tq=T, Tk=T)
        judge(got, expected, call=call, case=case, diagnose=diagnose, device=device, kata=kata,
              against=TORCH_MHA.replace("kdim, vdim, ", "") + ", called on (x, x, x)")


def test_no_causal_by_default(learner, bugs, kata, case_rng, rng, device):
    """no mask by default: every query attends to every key of the source, the last one included"""
    Tq = int(case_rng.integers(7, 10))
    tol, loose = kata.tolerance("float64"), kata.tolerance("float32")
    # A source longer than the target, then a shorter one: a causal mask hides keys from the first
    # query in either alignment.
    for Tk in (Tq + int(case_rng.integers(2, 5)), Tq - int(case_rng.integers(2, 4))):
        cfg = fresh_config(case_rng, Tq, Tk)
        B, _, _, d, H, _, _ = cfg
        sd = weights(rng, d, d, d)
        query, key, value = inputs(rng, B, Tq, Tk, d, d, d)
        call, case = call_text(cfg), case_text(cfg)
        m = build(learner, device, sd, cfg)
        got = forward(m, query, key, value)
        pair_form(got, cfg, dtype=torch.float64, device=device, call=call, case=case)
        compute = lambda impl: trusted(impl.MultiHeadAttention, sd, H, query, key, value, defaults=True)
        diagnose = lambda: causal_diagnosis(got[1]) or diagnosis(bugs, got, compute, loose, Tq=Tq, Tk=Tk)
        w = got[1].cpu()
        hidden = ~(w > 0)   # zero or NaN
        where = [int(i) for i in hidden.nonzero()[0]] if hidden.any() else None
        expect.that(where is None, "Called without masks, some queries do not see some keys: cross-attention "
                    "has no causal mask, every decoder token may read the whole source.", call=call, case=case,
                    got=f"{int(hidden.sum())} of {w.numel()} weights are 0 or NaN (first: weights"
                        f"[{', '.join(map(str, where or []))}])",
                    expected="every weight > 0: no mask given, none applied", diagnose=diagnose)
        key2, value2 = key.clone(), value.clone()
        key2[:, -1], value2[:, -1] = normal(rng, B, d), normal(rng, B, d)
        again = forward(m, query, key2, value2)
        pair_form(again, cfg, dtype=torch.float64, device=device, call=call, case=case)
        problem = expect.mismatch(again[0][:, 0], got[0][:, 0], **tol)
        expect.that(problem is not None, "Redrawing the last key and value of the source left the first query's "
                    "output unchanged: the first decoder token must read the whole source.", call=call,
                    case=case + f"; then key[:, {Tk - 1}] and value[:, {Tk - 1}] redrawn",
                    got="out[:, 0] unchanged", expected="out[:, 0] changed: query 0 attends to key Tk - 1 too",
                    diagnose=diagnose)
