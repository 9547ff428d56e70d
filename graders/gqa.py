"""Grader of the gqa kata (katas/gqa/README.md)."""
from math import prod

import torch
import torch.nn as nn
import torch.nn.functional as F

from graders.engine import expect
from graders.engine.recording import recorded
from graders.engine.structure import banned_used, check_untampered
from graders.engine.weights import inject, listing, normal

# (B, T, d_model, n_heads, n_kv_heads): groups of 3 over 2 KV heads and of 2 over 4, so tiling the
# KV heads instead of interleaving them sends most query heads to the wrong KV head; head_dim (4, 5)
# differs from n_heads and from T, so mixing up heads, time and channels shows too.
CONFIGS = [(2, 7, 24, 6, 2), (3, 6, 40, 8, 4)]
CASE = "x: {dtype} ({B}, {T}, {d}), standard normal; n_heads={H}, n_kv_heads={Hkv}; weights injected (W ~ N(0, 1/{d}))"
SDPA = "F.scaled_dot_product_attention(q, k, v, is_causal={causal}, enable_gqa=True) with the same weights"


def shapes(d, H, Hkv):
    kv = Hkv * (d // H)
    return {"q_proj.weight": [d, d], "k_proj.weight": [kv, d], "v_proj.weight": [kv, d], "o_proj.weight": [d, d]}


def weights(rng, d, H, Hkv):
    """A state_dict to inject. W ~ N(0, 1/d) keeps q, k, v at unit variance, so correctly scaled
    scores stay near unit variance too and a wrong scale moves the softmax visibly."""
    return {name: normal(rng, *shape, std=d ** -0.5) for name, shape in shapes(d, H, Hkv).items()}


def wrong_size(params, d, count=None):
    """kv-proj-wrong-size: K or V projected d -> d as in multi-head attention (all four
    projections square makes 4·d² parameters, whatever they are called)."""
    square = [d, d] in (params.get("k_proj.weight"), params.get("v_proj.weight"))
    return "kv-proj-wrong-size" if square or count == 4 * d * d else None


def build(learner, device, sd, H, Hkv):
    """The learner's module: constructed, its parameters checked, cast, moved, weights injected, eval."""
    d = sd["q_proj.weight"].shape[0]
    return inject(learner, learner.GroupedQueryAttention(d, H, Hkv), sd, device=device, exact=True,
                  call=f"GroupedQueryAttention({d}, {H}, {Hkv})",
                  problem="The module's parameters are not the four bias-free projections the grader injects "
                  "its weights into.",
                  hint=f": head_dim = {d} // {H} = {d // H}, and K and V have only n_kv_heads * head_dim = "
                  f"{Hkv * (d // H)} outputs; bias=False",
                  diagnose=lambda params: wrong_size(params, d))


@recorded
def trusted(cls, sd, H, Hkv, x, causal):
    """The output of a trusted module (the reference or a bug oracle), in float64 on the CPU."""
    with torch.no_grad():
        m = cls(x.shape[-1], H, Hkv).double()
        m.load_state_dict({k: v.double() for k, v in sd.items()})
        return m(x.double(), causal=causal).to(x.dtype)


def sdpa_gqa(sd, H, Hkv, x, causal):
    """F.scaled_dot_product_attention(..., enable_gqa=True) given the same weights, in float64:
    an oracle nobody here wrote, with torch's own grouping of query heads onto KV heads."""
    B, T, d = x.shape
    xd, w = x.double(), {k: v.double() for k, v in sd.items()}

    def heads(name, n):
        return (xd @ w[name].T).view(B, T, n, d // H).transpose(1, 2)   # (B, n, T, hd)

    y = F.scaled_dot_product_attention(heads("q_proj.weight", H), heads("k_proj.weight", Hkv),
                                       heads("v_proj.weight", Hkv), is_causal=causal, enable_gqa=True)   # (B, H, T, hd)
    return (y.transpose(1, 2).reshape(B, T, d) @ w["o_proj.weight"].T).to(x.dtype)   # (B, T, d)


def torch_mha(sd, H, x, causal):
    """nn.MultiheadAttention (bias=False) given the same weights: plain multi-head attention."""
    B, T, d = x.shape
    with torch.no_grad():
        mha = nn.MultiheadAttention(d, H, bias=False, batch_first=True).double().eval()
        in_proj = torch.cat([sd["q_proj.weight"], sd["k_proj.weight"], sd["v_proj.weight"]])   # rows [W_q; W_k; W_v]
        mha.load_state_dict({"in_proj_weight": in_proj.double(), "out_proj.weight": sd["o_proj.weight"].double()})
        # nn.MultiheadAttention's bool mask means True = may NOT attend: the opposite of this kit's.
        blocked = ~torch.ones(T, T, dtype=torch.bool).tril() if causal else None
        xd = x.double()
        out, _ = mha(xd, xd, xd, attn_mask=blocked, need_weights=False)
    return out.to(x.dtype)


def output_form(got, *, B, T, d, dtype, device, call, case):
    """A plain (B, T, d) tensor of the input's dtype on its device: what a property needs first."""
    expect.form(got, torch.Tensor, (B, T, d), dtype=dtype, device=device, call=call, case=case, what="the output")


def compare(learner, bugs, kata, rng, device, cfg, causal, *, dtype=torch.float64, oracle="sdpa"):
    """Build the learner's module for one config with fresh weights and input, and judge its output
    against the library oracle, then the reference, naming the known bug it matches."""
    B, T, d, H, Hkv = cfg
    sd = {k: v.to(dtype) for k, v in weights(rng, d, H, Hkv).items()}
    x = normal(rng, B, T, d).to(dtype)
    tol, loose = kata.tolerance(dtype), kata.tolerance("float32")
    call = f"GroupedQueryAttention({d}, {H}, {Hkv})(x, causal={causal})"
    case = CASE.format(dtype=str(dtype).removeprefix("torch."), B=B, T=T, d=d, H=H, Hkv=Hkv) + "; eval mode"
    got = build(learner, device, sd, H, Hkv)(x, causal=causal)
    # Matched within float32 rounding, so that a bug written with Llama's float32 softmax is named too.
    diagnose = lambda: bugs.match(got, lambda impl: trusted(impl.GroupedQueryAttention, sd, H, Hkv, x, causal),
                                  **loose)
    if oracle == "mha":
        expected, against = torch_mha(sd, H, x, causal), "nn.MultiheadAttention(bias=False) with the same weights"
    else:
        expected, against = sdpa_gqa(sd, H, Hkv, x, causal), SDPA.format(causal=causal)
    # These checks are about grouping, scale and masking: a float32 softmax inside passes, with a note.
    expect.array(got, expected, call=call, case=case, what="the output", diagnose=diagnose, device=device,
                 against=against, **tol, float32_inside=loose)
    expect.array(got, trusted(bugs.reference.GroupedQueryAttention, sd, H, Hkv, x, causal), call=call, case=case,
                 what="the output", diagnose=diagnose, device=device, **tol, float32_inside=loose)


def kv_heads(t, x) -> str:
    """Which head of x each head of t copies, e.g. [kv0, kv0, kv1, kv1]: the grouping at a glance."""
    found = [[i for i in range(x.shape[1]) if torch.equal(t[:, j].cpu(), x[:, i])] for j in range(t.shape[1])]
    return "[" + ", ".join(f"kv{i[0]}" if i else "?" for i in found) + "]"


def test_repeat_kv_interleaves(learner, bugs, rng, device):
    """repeat_kv: output head j is KV head j // n_rep (repeat_interleave), and n_rep=1 changes nothing"""
    # (B, n_kv_heads, T, head_dim, n_rep, dtype); a copy is exact, so the comparison is too.
    for B, Hkv, T, hd, n_rep, dtype in ((2, 2, 5, 4, 3, torch.float64), (3, 4, 6, 5, 2, torch.float32),
                                        (2, 3, 5, 4, 1, torch.float64)):
        x = normal(rng, B, Hkv, T, hd).to(dtype)
        got = learner.repeat_kv(x, n_rep)
        expected = bugs.expected.repeated(x, n_rep)   # (B, Hkv * n_rep, T, hd)
        call = f"repeat_kv(x, {n_rep})"
        case = f"x: {str(dtype).removeprefix('torch.')} ({B}, {Hkv}, {T}, {hd}) = (B, n_kv_heads, T, head_dim), standard normal"
        diagnose = lambda: bugs.match(got, lambda impl: impl.repeat_kv(x, n_rep), rtol=0, atol=0)
        if type(got) is torch.Tensor and got.shape == expected.shape and got.dtype == dtype:
            order, wanted = kv_heads(got, x), kv_heads(expected, x)
            expect.that(order == wanted, "The output heads copy the wrong KV heads: output head j must be KV head "
                        "j // n_rep, so the copies of each KV head sit side by side.", call=call, case=case,
                        got=f"output heads {order}", expected=f"output heads {wanted}", diagnose=diagnose)
        expect.array(got, expected, call=call, case=case, rtol=0, atol=0, device=device, diagnose=diagnose,
                     against="x[:, j // n_rep] for output head j" if n_rep > 1 else "x itself (n_rep=1)")


def test_parameter_count(learner):
    """2·d² + 2·d·n_kv_heads·head_dim parameters: Q and O are d -> d, K and V only d -> n_kv_heads·head_dim"""
    for d, H, Hkv in ((24, 6, 2), (40, 8, 4), (24, 6, 1)):
        m = learner.GroupedQueryAttention(d, H, Hkv)
        params = {name: entry[0] for name, entry in learner.module_info(m)["parameters"].items()}
        count = sum(prod(shape) for shape in params.values())
        kv = Hkv * (d // H)
        expected = 2 * d * d + 2 * d * kv
        expect.that(count == expected, "The module has the wrong number of parameters.",
                    call=f"GroupedQueryAttention({d}, {H}, {Hkv})", got=f"{count:,} ({listing(params)})",
                    expected=f"2·{d}² + 2·{d}·{kv} = {expected:,}: q_proj and o_proj {d}x{d}, k_proj and v_proj "
                             f"{kv}x{d} (n_kv_heads * head_dim = {Hkv}·{d // H} outputs), no biases",
                    diagnose=lambda: wrong_size(params, d, count))
    check_untampered(learner, call=f"GroupedQueryAttention({d}, {H}, {Hkv})")


def test_matches_sdpa_gqa(learner, bugs, kata, rng, device):
    """with injected weights, equals the reference and F.scaled_dot_product_attention(enable_gqa=True), causal and not"""
    for cfg in CONFIGS:
        for causal in (False, True):
            compare(learner, bugs, kata, rng, device, cfg, causal)
    compare(learner, bugs, kata, rng, device, CONFIGS[0], True, dtype=torch.float32)


def test_equals_mha_when_kv_equals_heads(learner, bugs, kata, rng, device):
    """n_kv_heads == n_heads is plain multi-head attention: equals nn.MultiheadAttention(bias=False)"""
    for (B, T, d, H, _), causal in zip(CONFIGS, (True, False)):
        compare(learner, bugs, kata, rng, device, (B, T, d, H, H), causal, oracle="mha")


def test_rejects_bad_divisibility(learner):
    """n_heads not dividing d_model, or n_kv_heads not dividing n_heads, raises ValueError or AssertionError"""
    learner.GroupedQueryAttention(24, 6, 2)   # a valid configuration builds: only the bad ones may raise
    for d, H, Hkv, why in ((24, 5, 1, "5 heads cannot split 24 channels evenly"),
                           (24, 6, 4, "6 query heads cannot be split into 4 equal groups")):
        expect.refused(lambda: learner.GroupedQueryAttention(d, H, Hkv), call=f"GroupedQueryAttention({d}, {H}, {Hkv})",
                       expected="ValueError (or AssertionError) from __init__: check d_model % n_heads == 0 and "
                                "n_heads % n_kv_heads == 0 before anything else",
                       raised=f"{why}, but the error raised is not the expected one.",
                       returned=f"{why}, yet a module was built.")


def test_banned_api(learner, kata, rng, device):
    """no SDPA or nn.MultiheadAttention: attention written by hand"""
    # Only this property: a forward that completes without a library attention, whatever it returns.
    B, T, d, H, Hkv = CONFIGS[0]
    call = f"GroupedQueryAttention({d}, {H}, {Hkv})(x, causal=True)"
    case = CASE.format(dtype="float64", B=B, T=T, d=d, H=H, Hkv=Hkv) + "; eval mode"
    m = build(learner, device, weights(rng, d, H, Hkv), H, Hkv)
    m(normal(rng, B, T, d), causal=True)   # first call: lets lazy imports happen before recording
    x = normal(rng, B, T, d)   # fresh: no earlier call saw it, so memoised outputs cannot skip the ops
    with learner.recording() as ops:
        m(x, causal=True)
    used = banned_used(learner.source, ops, kata.banned)
    expect.that(not used, "The module uses a library attention this kata forbids.", call=call, case=case,
                got=", ".join(used), expected="attention written with matmul, masked_fill and softmax",
                diagnose=lambda: "banned-api")
    check_untampered(learner, call=call, case=case)
