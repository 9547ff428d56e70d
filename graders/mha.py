"""Grader of the mha kata (katas/mha/README.md)."""
from math import prod

import torch
import torch.nn as nn

from graders.engine import expect
from graders.engine.learner import describe_value
from graders.engine.recording import recorded
from graders.engine.structure import banned_used, check_untampered
from graders.engine.weights import inject, normal

# (B, T, d_model, n_heads): n_heads != head_dim != T, so mixing up heads, time and channels shows.
CONFIGS = [(2, 7, 24, 4), (3, 5, 30, 2)]
KEYS = ["qkv_proj.weight", "qkv_proj.bias", "out_proj.weight", "out_proj.bias"]
CASE = "x: {dtype} ({B}, {T}, {d}), standard normal; n_heads={H}; weights injected (W ~ N(0, 1/{d}), b ~ N(0, 0.25))"


def weights(rng, d):
    """A state_dict to inject. W ~ N(0, 1/d) keeps q, k, v at unit variance, so correctly scaled
    scores stay near unit variance too and every scaling bug moves the softmax visibly."""
    return {"qkv_proj.weight": normal(rng, 3 * d, d, std=d ** -0.5), "qkv_proj.bias": normal(rng, 3 * d, std=0.5),
            "out_proj.weight": normal(rng, d, d, std=d ** -0.5), "out_proj.bias": normal(rng, d, std=0.5)}


def shapes(d):
    return {"qkv_proj.weight": [3 * d, d], "qkv_proj.bias": [3 * d], "out_proj.weight": [d, d], "out_proj.bias": [d]}


def build(learner, device, sd, n_heads, dropout=0.0):
    """The learner's module: constructed, cast to the weights' dtype, moved, weights injected, eval
    mode. ``dropout=None`` leaves the argument out: the module's own default."""
    d = sd["out_proj.weight"].shape[0]
    m = learner.MultiHeadSelfAttention(d, n_heads) if dropout is None else \
        learner.MultiHeadSelfAttention(d, n_heads, dropout=dropout)
    return inject(learner, m, sd, device=device,
                  call=f"MultiHeadSelfAttention({d}, {n_heads}" + ("" if dropout is None else f", dropout={dropout}") + ")",
                  problem="The module lacks the parameters the grader injects weights into.",
                  hint=" (self.qkv_proj = nn.Linear(d_model, 3 * d_model); self.out_proj = nn.Linear(d_model, d_model))")


@recorded
def trusted(cls, sd, n_heads, x, causal, *, dropout=0.0, training=False, seed=0):
    """(out, weights) of a trusted module (the reference or a bug oracle), in float64 on the CPU,
    with the torch seed the sandbox sets before each call, so dropout draws the same mask."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        m = cls(x.shape[-1], n_heads, dropout=dropout).double()
        m.load_state_dict({k: v.double() for k, v in sd.items()})
        m.train(training)
        torch.manual_seed(seed)
        out, att = m(x.double(), causal=causal)
    return out.to(x.dtype), att.to(x.dtype)


def torch_mha(sd, n_heads, x, causal):
    """nn.MultiheadAttention given the same weights: an oracle nobody here wrote."""
    B, T, d = x.shape
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        mha = nn.MultiheadAttention(d, n_heads, bias=True, batch_first=True).double().eval()
        mha.load_state_dict({"in_proj_weight": sd["qkv_proj.weight"], "in_proj_bias": sd["qkv_proj.bias"],
                             "out_proj.weight": sd["out_proj.weight"], "out_proj.bias": sd["out_proj.bias"]})
        # nn.MultiheadAttention's bool mask means True = may NOT attend: the opposite of this kit's.
        blocked = ~torch.ones(T, T, dtype=torch.bool).tril() if causal else None
        xd = x.double()
        out, att = mha(xd, xd, xd, attn_mask=blocked, need_weights=True, average_attn_weights=False)
    return out.to(x.dtype), att.to(x.dtype)


def pair(got, *, call, case):
    """forward returned a pair (out, weights)."""
    expect.that(type(got) is tuple and len(got) == 2, "forward must return a pair (out, weights).", call=call,
                case=case, got=describe_value(got), expected="tuple (out (B, T, d_model), weights (B, n_heads, T, T))")


def pair_form(got, *, B, T, d, H, dtype, device, call, case):
    """forward returned (out (B, T, d), weights (B, H, T, T)) of the input's dtype, on its device:
    what property checks need before they look at values."""
    pair(got, call=call, case=case)
    for what, value, shape in (("the output", got[0], (B, T, d)), ("the weights", got[1], (B, H, T, T))):
        expect.form(value, torch.Tensor, shape, dtype=dtype, device=device, call=call, case=case, what=what)


def weights_diagnosis(w, causal):
    """A bug named from the weights' pattern alone, whatever else is wrong: normalised along
    another axis, or a causal mask whose zeros sit in the wrong triangle."""
    if type(w) is not torch.Tensor or w.dim() != 4 or w.shape[-1] != w.shape[-2]:
        return None
    w = w.detach().cpu().double()
    T = w.shape[-1]

    def ones(s):
        return bool(torch.isclose(s, torch.ones_like(s), atol=1e-6).all())

    if not ones(w.sum(-1)) and (ones(w.sum(-2)) or ones(w.sum(1))):
        return "softmax-wrong-dim"
    if causal:
        allowed = w != 0
        tril = torch.ones(T, T, dtype=torch.bool).tril()
        # each bug leaves one query with no key at all (a NaN or uniform row): skip that row.
        for code, pattern, empty_row in (("mask-inverted", ~tril, T - 1), ("mask-excludes-diagonal", tril.tril(-1), 0)):
            rows = [i for i in range(T) if i != empty_row]
            if bool((allowed[..., rows, :] == pattern[rows]).all()):
                return code
    return None


def diagnosis(bugs, got, compute, tol, causal):
    """The known bug behind a wrong (out, weights) pair: both tensors, else either one, else the pattern."""
    return (bugs.match(got, compute, **tol)
            or bugs.match(got[1], lambda impl: compute(impl)[1], **tol)
            or bugs.match(got[0], lambda impl: compute(impl)[0], **tol)
            or weights_diagnosis(got[1], causal))


def test_state_dict_keys(learner):
    """the parameters are exactly qkv_proj.weight, qkv_proj.bias, out_proj.weight, out_proj.bias, all in state_dict"""
    d, H = 24, 4
    m = learner.MultiHeadSelfAttention(d, H)
    info = learner.module_info(m)
    call = f"MultiHeadSelfAttention({d}, {H})"
    # A registered mask (nanoGPT's `bias` buffer) may sit beside them: only parameters are judged.
    names = list(info["parameters"])
    expect.that(sorted(names) == sorted(KEYS), "The module's parameters are not the kata's.",
                call=f"{call}.named_parameters()", got=", ".join(names) or "no parameters",
                expected=", ".join(KEYS) + " (self.qkv_proj = nn.Linear(d_model, 3 * d_model); "
                "self.out_proj = nn.Linear(d_model, d_model))")
    params = {name: entry[0] for name, entry in info["parameters"].items()}
    for key, shape in shapes(d).items():
        expect.that(params.get(key) == shape, f"{key} has the wrong shape.", call=call,
                    got=f"{key}: {params.get(key)}", expected=f"{key}: {shape}, rows stacked [W_q; W_k; W_v] for qkv_proj")
    missing = [k for k in KEYS if k not in info["state_dict"]]
    expect.that(not missing, "Some parameters are missing from state_dict, so a saved model would lose them.",
                call=f"{call}.state_dict().keys()", got=", ".join(info["state_dict"]) or "no keys",
                expected=", ".join(KEYS) + ", and any buffers you register")
    check_untampered(learner, call=f"{call}.state_dict().keys()")


def test_parameter_count(learner):
    """4·d² + 4·d parameters: fused Q/K/V and output projections, with biases"""
    for d, H in ((24, 4), (30, 2)):
        m = learner.MultiHeadSelfAttention(d, H)
        params = learner.module_info(m)["parameters"]
        count = sum(prod(entry[0]) for entry in params.values())
        expect.that(count == 4 * d * d + 4 * d, "The module has the wrong number of parameters.",
                    call=f"MultiHeadSelfAttention({d}, {H})",
                    got=f"{count:,} ({', '.join(f'{k} {tuple(v[0])}' for k, v in params.items()) or 'none'})",
                    expected=f"4·{d}² + 4·{d} = {4 * d * d + 4 * d:,}: 3·d² + 3·d for qkv_proj, d² + d for out_proj")
    check_untampered(learner, call=f"MultiHeadSelfAttention({d}, {H})")


def test_matches_torch_mha(learner, bugs, kata, rng, device):
    """with injected weights, output and per-head weights equal nn.MultiheadAttention, causal and not"""
    cases = [(cfg, torch.float64, causal) for cfg in CONFIGS for causal in (False, True)]
    cases.append((CONFIGS[0], torch.float32, True))
    for (B, T, d, H), dtype, causal in cases:
        sd = {k: v.to(dtype) for k, v in weights(rng, d).items()}
        x = normal(rng, B, T, d).to(dtype)
        tol = kata.tolerance(dtype)
        m = build(learner, device, sd, H)
        # causal=False is forward's default: the non-causal cases leave it out.
        call = f"MultiHeadSelfAttention({d}, {H})(x{', causal=True' if causal else ''})"
        case = CASE.format(dtype=str(dtype).removeprefix("torch."), B=B, T=T, d=d, H=H) \
            + "; eval mode; expected: torch.nn.MultiheadAttention with the same weights"
        got = m(x, causal=True) if causal else m(x)
        pair(got, call=call, case=case)
        expected = torch_mha(sd, H, x, causal)
        diagnose = lambda: diagnosis(bugs, got, lambda impl: trusted(impl.MultiHeadSelfAttention, sd, H, x, causal),
                                     tol, causal)
        for what, value, want in (("the output", got[0], expected[0]), ("the weights", got[1], expected[1])):
            expect.array(value, want, call=call, case=case, what=what, diagnose=diagnose, device=device,
                         against="nn.MultiheadAttention with the same weights", **tol,
                         float32_inside=expect.float32_inside(kata, dtype))


def test_eval_deterministic(learner, bugs, kata, rng, device):
    """eval mode with dropout=0.1 drops nothing: it equals the same module with dropout=0.0"""
    B, T, d, H = CONFIGS[0]
    p = 0.1
    tol = kata.tolerance("float64")
    sd, x = weights(rng, d), normal(rng, B, T, d)
    call = f"MultiHeadSelfAttention({d}, {H}, dropout={p}).eval()(x)"
    case = CASE.format(dtype="float64", B=B, T=T, d=d, H=H) + "; compared with the same weights and dropout=0.0"
    got = build(learner, device, sd, H, dropout=p)(x)
    pair_form(got, B=B, T=T, d=d, H=H, dtype=torch.float64, device=device, call=call, case=case)
    plain_call = f"MultiHeadSelfAttention({d}, {H}, dropout=0.0).eval()(x)"
    plain = build(learner, device, sd, H)(x)
    pair_form(plain, B=B, T=T, d=d, H=H, dtype=torch.float64, device=device, call=plain_call, case=case)

    def diagnose():
        w, w0 = got[1].cpu(), plain[1].cpu()
        dropped = (w == 0) & (w0 != 0)
        if dropped.any() and torch.allclose(w[~dropped], w0[~dropped] / (1 - p), **tol):
            return "dropout-in-eval"
        return bugs.match(got, lambda impl: trusted(impl.MultiHeadSelfAttention, sd, H, x, False, dropout=p,
                                                    seed=learner.seed), **tol)

    for what, value, reference in (("the weights", got[1], plain[1]), ("the output", got[0], plain[0])):
        problem = expect.mismatch(value, reference, **tol)
        expect.that(problem is None, f"In eval mode, dropout={p} changed {what}: after .eval() dropout must be off.",
                    call=call, case=case, got=f"compared with dropout=0.0, {problem}",
                    expected=f"{what} of the same module built with dropout=0.0", diagnose=diagnose)


def test_train_drops_weights(learner, bugs, kata, rng, device):
    """train mode drops attention weights, and the weights returned are the ones applied to V"""
    B, T, d, H = CONFIGS[0]
    p = 0.25
    tol = kata.tolerance("float64")
    sd, x = weights(rng, d), normal(rng, B, T, d)
    call = f"MultiHeadSelfAttention({d}, {H}, dropout={p}).train()(x)"
    case = CASE.format(dtype="float64", B=B, T=T, d=d, H=H)
    # The weights before dropout, from the learner's own module built with the default dropout
    # (0.0) and in train mode too: a default that drops would show here.
    plain_module = build(learner, device, sd, H, dropout=None)
    plain_module.train()
    plain = plain_module(x)
    pair_form(plain, B=B, T=T, d=d, H=H, dtype=torch.float64, device=device,
              call=f"MultiHeadSelfAttention({d}, {H}).train()(x)", case=case)
    m = build(learner, device, sd, H, dropout=p)
    m.train()
    got = m(x)
    pair_form(got, B=B, T=T, d=d, H=H, dtype=torch.float64, device=device, call=call, case=case)
    w, w_plain = got[1].cpu(), plain[1].cpu()

    def diagnose():
        code = bugs.match(got, lambda impl: trusted(impl.MultiHeadSelfAttention, sd, H, x, False, dropout=p,
                                                    training=True, seed=learner.seed), **tol)
        # Whatever the random stream: undropped weights beside a dropped output are d2l's habit.
        undropped = expect.mismatch(w, w_plain, **tol) is None
        return code or ("weights-before-dropout" if undropped and expect.mismatch(got[0], plain[0], **tol) else None)

    dropped = (w == 0) & (w_plain != 0)
    share = dropped.sum().item() / w.numel()
    expect.that(0.1 < share < 0.4, "In train mode, the weights returned are not dropped out as dropout "
                f"p={p} would: about {p:.0%} of them should be exactly 0. Apply dropout to the softmaxed "
                "weights and return them after dropout.", call=call, case=case,
                got=f"{share:.1%} of the weights set to 0", expected=f"about {p:.0%} (10% to 40%)",
                diagnose=diagnose)
    problem = expect.mismatch(w[~dropped], w_plain[~dropped] / (1 - p), **tol)
    expect.that(problem is None, "In train mode, the weights that are kept must be divided by 1 - p, so that each "
                "weight keeps its expected value.", call=call, case=case,
                got=f"kept weights vs the weights of dropout=0.0 / (1 - p): {problem}",
                expected=f"the weights of the same module built with dropout=0.0, divided by {1 - p:g}",
                diagnose=diagnose)
    v = (x @ sd["qkv_proj.weight"][2 * d:].T + sd["qkv_proj.bias"][2 * d:]).view(B, T, H, d // H).transpose(1, 2)

    def applied(att):   # (B, T, d): weights applied to V, the heads merged, out_proj
        return (att @ v).transpose(1, 2).reshape(B, T, d) @ sd["out_proj.weight"].T + sd["out_proj.bias"]

    # The output is recomputed from the weights returned, the kata's way, only where that way gives
    # the module's own output without dropout: a module that splits or merges the heads otherwise,
    # or skips out_proj, applies its weights another way (matches-torch-mha reports it), and a
    # failure here would blame the dropout for it.
    if expect.mismatch(plain[0], applied(w_plain), **tol) is None:
        problem = expect.mismatch(got[0], applied(w), **tol)
        expect.that(problem is None, "In train mode, the output is not the returned weights applied to V: return "
                    "the weights after dropout, the ones you multiply V by.", call=call, case=case,
                    got=f"out vs out_proj(merge_heads(weights @ v)): {problem}",
                    expected="out == out_proj(merge_heads(weights @ v)) for the weights returned, as it is with "
                             "dropout=0.0", diagnose=diagnose)


def test_rejects_indivisible_heads(learner):
    """d_model % n_heads != 0 raises ValueError or AssertionError"""
    learner.MultiHeadSelfAttention(24, 4)   # a valid configuration builds: only the bad one may raise
    expect.refused(lambda: learner.MultiHeadSelfAttention(24, 5), call="MultiHeadSelfAttention(24, 5)",
                   expected="ValueError (or AssertionError) from __init__: check d_model % n_heads == 0 before "
                            "anything else",
                   raised="5 heads cannot split 24 channels, but the error raised is not the expected one.",
                   returned="5 heads cannot split 24 channels evenly, yet a module was built.")


def test_banned_api(learner, kata, rng, device):
    """no SDPA or nn.MultiheadAttention: attention written by hand"""
    B, T, d, H = CONFIGS[0]
    call = f"MultiHeadSelfAttention({d}, {H})(x, causal=True)"
    case = CASE.format(dtype="float64", B=B, T=T, d=d, H=H) + "; eval mode"
    sd = weights(rng, d)
    m = build(learner, device, sd, H)
    m(normal(rng, B, T, d), causal=True)   # first call: lets lazy imports happen before recording
    x = normal(rng, B, T, d)   # fresh: no earlier call saw it, so memoised outputs cannot skip the ops
    with learner.recording() as ops:
        m(x, causal=True)
    used = banned_used(learner.source, ops, kata.banned)
    expect.that(not used, "The module uses a library attention this kata forbids.", call=call,
                got=", ".join(used), expected="attention written with matmul, masked_fill and softmax",
                diagnose=lambda: "banned-api")
    check_untampered(learner, call=call, case=case)
