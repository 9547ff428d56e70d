"""Grader of the cross-attention kata (the issue that adds it: an encoder–decoder's attention,
queries from the decoder, keys and values from the encoder's output)."""
from math import prod

import torch
import torch.nn as nn

from graders.engine import expect
from graders.engine.failures import CheckFailed, LearnerRaised, sentence
from graders.engine.learner import describe_value
from graders.engine.recording import recorded
from graders.engine.structure import banned_used, check_untampered
from graders.engine.weights import inject, listing, normal

# (B, Tq, Tk, d_model, n_heads, kdim, vdim); kdim/vdim None: left out, the defaults (d_model).
# Tq != Tk and B != n_heads != head_dim everywhere, and kdim != vdim != d_model where they are given,
# so keys read from the query, a padding mask laid along the wrong axis, a (B, Tq, Tk) mask
# broadcast over the heads instead of the batch, or k_proj sized from d_model cannot go unseen.
DEFAULTS = (2, 5, 7, 24, 4, None, None)        # head_dim 6: nn.MultiheadAttention's in_proj_weight layout
WIDTHS = (3, 6, 9, 20, 2, 11, 7)               # head_dim 10: its separate q/k/v_proj_weight layout
LONG_QUERIES = (2, 8, 5, 12, 3, 10, 7)         # Tq > Tk, head_dim 4
KEYS = ["q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias",
        "out_proj.weight", "out_proj.bias"]
CASE = ("query: {dtype} ({B}, {Tq}, {d}), key: ({B}, {Tk}, {kdim}), value: ({B}, {Tk}, {vdim}), standard normal; "
        "n_heads={H}; weights injected (W ~ N(0, 1/fan_in), b ~ N(0, 0.25))")
TORCH_MHA = "nn.MultiheadAttention(d_model, n_heads, kdim, vdim, batch_first=True) with the same weights"


def widths(cfg):
    """(d_model, kdim, vdim) of a config, the defaults filled in."""
    d, kdim, vdim = cfg[3], cfg[5], cfg[6]
    return d, d if kdim is None else kdim, d if vdim is None else vdim


def shapes(d, kdim, vdim):
    return {"q_proj.weight": [d, d], "q_proj.bias": [d], "k_proj.weight": [d, kdim], "k_proj.bias": [d],
            "v_proj.weight": [d, vdim], "v_proj.bias": [d], "out_proj.weight": [d, d], "out_proj.bias": [d]}


def weights(rng, d, kdim, vdim, dtype=torch.float64):
    """A state_dict to inject. W ~ N(0, 1/fan_in) keeps q, k and v at unit variance whatever the
    key's and value's widths, so correctly scaled scores stay near unit variance and every scaling
    or masking bug moves the softmax visibly."""
    sd = {name: normal(rng, *shape, std=shape[1] ** -0.5 if len(shape) == 2 else 0.5)
          for name, shape in shapes(d, kdim, vdim).items()}
    return {k: v.to(dtype) for k, v in sd.items()}


def inputs(rng, B, Tq, Tk, d, kdim, vdim, dtype=torch.float64):
    """query (B, Tq, d), key (B, Tk, kdim) and value (B, Tk, vdim): three different tensors, so
    reading one for another shows."""
    return tuple(normal(rng, B, T, w).to(dtype) for T, w in ((Tq, d), (Tk, kdim), (Tk, vdim)))


def padding(case_rng, B, Tk):
    """key_padding_mask (B, Tk), True on each sequence's first lengths[b] keys: lengths differ
    between rows and each row keeps 2 real keys or more and 1 padded key or more, so no query is
    left without a key, even when the mask is read inverted."""
    lengths = torch.from_numpy(case_rng.choice(range(2, Tk), size=B, replace=False))
    return torch.arange(Tk)[None, :] < lengths[:, None]   # (B, Tk)


def pattern(case_rng, *lead, Tq, Tk):
    """A random attn_mask (*lead, Tq, Tk), True = may attend. Key 0 is allowed to every query and
    key 1 to none (both are real keys in every padded row), so every row keeps a key, even inverted."""
    allowed = torch.from_numpy(case_rng.random((*lead, Tq, Tk)) < 0.6)
    allowed[..., 0], allowed[..., 1] = True, False
    return allowed


def lengths_text(kpm):
    return f"lengths {kpm.sum(-1).tolist()} of Tk={kpm.shape[-1]} (True = a real key)"


def case_text(cfg, dtype=torch.float64, kpm=None, attn=None, about=""):
    B, Tq, Tk, _, H, _, _ = cfg
    d, kdim, vdim = widths(cfg)
    parts = [CASE.format(dtype=str(dtype).removeprefix("torch."), B=B, Tq=Tq, Tk=Tk, d=d, kdim=kdim, vdim=vdim, H=H)]
    if kpm is not None:
        parts.append(f"key_padding_mask: {lengths_text(kpm)}")
    if attn is not None:
        parts.append(f"attn_mask: random bool {tuple(attn.shape)}, True = may attend, every row with an allowed key")
    return "; ".join(parts + ([about] if about else [])) + "; eval mode"


def constructor(cfg) -> str:
    d, kdim, vdim = widths(cfg)
    return f"MultiHeadAttention({d}, {cfg[4]}" + ("" if cfg[5] is None else f", kdim={kdim}, vdim={vdim}") + ")"


def call_text(cfg, kpm=None, attn=None) -> str:
    masks = ("" if kpm is None else ", key_padding_mask=kpm") + ("" if attn is None else ", attn_mask=attn_mask")
    return f"{constructor(cfg)}(query, key, value{masks})"


def params_diagnosis(params, d, kdim, vdim):
    """kdim-ignored: k_proj or v_proj reads d_model (or the other's) channels where kdim or vdim were given."""
    k, v = params.get("k_proj.weight"), params.get("v_proj.weight")
    return "kdim-ignored" if (k is not None and k != [d, kdim]) or (v is not None and v != [d, vdim]) else None


def construct(learner, cfg):
    """The learner's module for a config: kdim and vdim passed only when the config gives them."""
    d, kdim, vdim = widths(cfg)
    return learner.MultiHeadAttention(d, cfg[4]) if cfg[5] is None else \
        learner.MultiHeadAttention(d, cfg[4], kdim=kdim, vdim=vdim)


def build(learner, device, sd, cfg):
    """The learner's module for a config: constructed, its parameters checked, cast to the
    weights' dtype, moved, weights injected, eval mode."""
    d, kdim, vdim = widths(cfg)
    return inject(learner, construct(learner, cfg), sd, device=device, call=constructor(cfg),
                  problem="The module lacks the parameters the grader injects weights into.",
                  hint=" (k_proj = nn.Linear(kdim, d_model), v_proj = nn.Linear(vdim, d_model), with bias)",
                  diagnose=lambda params: params_diagnosis(params, d, kdim, vdim))


def forward(m, query, key, value, kpm=None, attn=None):
    """The learner's forward, given only the masks the case has: the others keep their defaults.
    A call with masks that raises is tried once more without them: (Tq, Tq) weights then say why a
    (B, Tk) or (Tq, Tk) mask could not fit (kv-from-query)."""
    masks = {name: mask for name, mask in (("key_padding_mask", kpm), ("attn_mask", attn)) if mask is not None}
    try:
        return m(query, key, value, **masks)
    except LearnerRaised as exc:
        if not masks or exc.type_name is None:
            raise
        try:
            exc.diagnosis = shape_diagnosis(m(query, key, value), query.shape[1], key.shape[1])
        except CheckFailed:
            pass
        raise


@recorded
def trusted(cls, sd, n_heads, query, key, value, kpm=None, attn=None, *, defaults=False):
    """(out, weights) of a trusted module (the reference or a bug oracle), in float64 on the CPU."""
    d, kdim, vdim = sd["q_proj.weight"].shape[0], sd["k_proj.weight"].shape[1], sd["v_proj.weight"].shape[1]
    with torch.no_grad():
        m = (cls(d, n_heads) if defaults else cls(d, n_heads, kdim=kdim, vdim=vdim)).double()
        m.load_state_dict({k: v.double() for k, v in sd.items()})
        out, att = forward(m, query.double(), key.double(), value.double(), kpm, attn)
    return out.to(query.dtype), att.to(query.dtype)


def torch_mha(sd, n_heads, query, key, value, kpm=None, attn=None):
    """nn.MultiheadAttention(..., kdim, vdim, batch_first=True) given the same weights: an oracle
    nobody here wrote. With kdim == vdim == d_model it keeps one in_proj_weight, rows stacked
    [W_q; W_k; W_v] (the mha kata's qkv_proj); otherwise q_proj_weight, k_proj_weight and
    v_proj_weight. Either way one in_proj_bias of 3·d_model."""
    d, kdim, vdim = sd["q_proj.weight"].shape[0], sd["k_proj.weight"].shape[1], sd["v_proj.weight"].shape[1]
    w = {k: v.double() for k, v in sd.items()}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        mha = nn.MultiheadAttention(d, n_heads, kdim=kdim, vdim=vdim, batch_first=True).double().eval()
        if "in_proj_weight" in mha.state_dict():
            state = {"in_proj_weight": torch.cat([w["q_proj.weight"], w["k_proj.weight"], w["v_proj.weight"]])}
        else:
            state = {f"{p}_proj_weight": w[f"{p}_proj.weight"] for p in "qkv"}
        mha.load_state_dict({**state, "in_proj_bias": torch.cat([w["q_proj.bias"], w["k_proj.bias"], w["v_proj.bias"]]),
                             "out_proj.weight": w["out_proj.weight"], "out_proj.bias": w["out_proj.bias"]})
        # nn.MultiheadAttention's bool masks mean True = may NOT attend: the opposite of this kit's.
        # A 3-D attn_mask is (B * n_heads, Tq, Tk) there, batch-major: each row's mask once per head.
        blocked = None if attn is None else ~attn if attn.dim() == 2 else (~attn).repeat_interleave(n_heads, dim=0)
        out, att = mha(query.double(), key.double(), value.double(), key_padding_mask=None if kpm is None else ~kpm,
                       attn_mask=blocked, need_weights=True, average_attn_weights=False)
    return out.to(query.dtype), att.to(query.dtype)


def pair(got, *, call, case):
    """forward returned a pair (out, weights)."""
    expect.that(type(got) is tuple and len(got) == 2, "forward must return a pair (out, weights).", call=call,
                case=case, got=describe_value(got),
                expected="tuple (out (B, Tq, d_model), weights (B, n_heads, Tq, Tk))")


def shape_diagnosis(got, Tq, Tk):
    """kv-from-query: the weights are (..., Tq, Tq) where (..., Tq, Tk) is due, so the keys were the queries."""
    w = got[1] if type(got) is tuple and len(got) == 2 else None
    if type(w) is torch.Tensor and w.dim() >= 2 and Tq != Tk and tuple(w.shape[-2:]) == (Tq, Tq):
        return "kv-from-query"
    return None


def tensor_form(value, shape, dtype, *, what, call, case, diagnose, meaning=""):
    """``value`` is a plain tensor of ``shape`` and ``dtype``, judged in that order; a wrong shape
    asks ``diagnose``. The weights come back in the input's dtype like the output: code that
    computes its softmax in float32 inside casts the weights back too, not only the output."""
    expect.type_of(value, torch.Tensor, call=call, case=case, what=what)
    Name, verb = sentence(what), "have" if what == "the weights" else "has"
    expect.that(tuple(value.shape) == tuple(shape), f"{Name} {verb} the wrong shape.", call=call, case=case,
                got=f"shape {tuple(value.shape)}", expected=f"shape {tuple(shape)}{meaning}", diagnose=diagnose)
    float32_weights = what == "the weights" and (value.dtype, dtype) == (torch.float32, torch.float64)
    cast_back = (" A softmax computed in float32 inside is cast back to the input's dtype, and the weights "
                 "returned are the cast-back ones: `att = F.softmax(att, dim=-1, dtype=torch.float32).to(q.dtype)`, "
                 "then `att @ v`, and return that `att`." if float32_weights else "")
    expect.that(value.dtype == dtype, f"{Name} {verb} the wrong dtype: forward returns the output and the weights "
                f"in the input's dtype, {str(dtype).removeprefix('torch.')} here.{cast_back}", call=call, case=case,
                got=str(value.dtype).removeprefix("torch."), expected=str(dtype).removeprefix("torch."))


def pair_form(got, cfg, *, dtype, device, call, case):
    """forward returned (out (B, Tq, d), weights (B, H, Tq, Tk)) of the input's dtype, on its
    device: what a property check needs before it looks at values."""
    B, Tq, Tk, d, H = cfg[:5]
    pair(got, call=call, case=case)
    for what, value, shape, meaning in (
            ("the output", got[0], (B, Tq, d), "(B, Tq, d_model): one output per query"),
            ("the weights", got[1], (B, H, Tq, Tk), "(B, n_heads, Tq, Tk): one row per query, one column per key")):
        tensor_form(value, shape, dtype, what=what, call=call, case=case, meaning=f" = {meaning}",
                    diagnose=lambda: shape_diagnosis(got, Tq, Tk))
        expect.form(value, torch.Tensor, shape, dtype=dtype, device=device, call=call, case=case, what=what)


def judge(got, expected, *, call, case, diagnose, device, against, kata, dtype=torch.float64):
    """(out, weights) equal ``expected``: each in form (tensor_form: the weights' dtype named
    with its cause), then on the device, then in value to the dtype's tolerance, a float64 case
    accepting float32 inside with a note."""
    for what, value, want in (("the output", got[0], expected[0]), ("the weights", got[1], expected[1])):
        tensor_form(value, want.shape, want.dtype, what=what, call=call, case=case, diagnose=diagnose)
        expect.array(value, want, call=call, case=case, what=what, diagnose=diagnose, device=device,
                     against=against, **kata.tolerance(dtype), float32_inside=expect.float32_inside(kata, dtype))


def _weights(w):
    return w.detach().cpu().double() if type(w) is torch.Tensor and w.dim() == 4 else None


def padding_diagnosis(w, kpm):
    """A padding bug named from the weights' zeros alone, whatever else is wrong: zeros on the
    real keys (the mask read inverted), or the padded positions' query rows blocked (NaN or
    uniform) while the padded keys keep their weight (the mask laid along the queries)."""
    w = _weights(w)
    if w is None or w.shape[0] != kpm.shape[0] or w.shape[-1] != kpm.shape[-1]:
        return None
    real = kpm[:, None, None, :].expand(w.shape)   # (B, H, Tq, Tk)
    if bool(torch.isfinite(w).all()) and bool(((w == 0) == real).all()):
        return "padding-mask-inverted"
    if w.shape[-2] == w.shape[-1]:
        rows = kpm[:, None, :].expand(w.shape[:-1])   # (B, H, Tq): the query at a real position
        spread = w[~rows]
        blocked = torch.isnan(spread).all(-1) | ((spread - spread[:, :1]).abs().amax(-1) < 1e-9)
        if spread.numel() and bool(blocked.all()) and not bool((w[rows] == 0).any()):
            return "padding-on-queries"
    return None


def causal_diagnosis(w):
    """causal-in-cross: the zero (or NaN) weights form a causal triangle, top-left or bottom-right aligned."""
    w = _weights(w)
    if w is None:
        return None
    Tq, Tk = w.shape[-2:]
    hidden = (w == 0) | torch.isnan(w)
    for offset in (0, Tk - Tq):
        blocked = ~torch.ones(Tq, Tk, dtype=torch.bool).tril(offset)
        rows = [i for i in range(Tq) if not bool(blocked[i].all())]   # a query left without keys is NaN or uniform
        if blocked[rows].any() and bool((hidden[..., rows, :] == blocked[rows]).all()):
            return "causal-in-cross"
    return None


def diagnosis(bugs, got, compute, tol, *, kpm=None, attn=None, Tq=None, Tk=None):
    """The known bug behind a wrong (out, weights) pair: both tensors, else either one, else the
    weights' shape or zeros."""
    if type(got) is not tuple or len(got) != 2:
        return None
    code = (bugs.match(got, compute, **tol)
            or bugs.match(got[1], lambda impl: compute(impl)[1], **tol)
            or bugs.match(got[0], lambda impl: compute(impl)[0], **tol)
            or shape_diagnosis(got, Tq, Tk))
    if code is None and kpm is not None and attn is None:
        code = padding_diagnosis(got[1], kpm)
    if code is None and kpm is None and attn is None:
        code = causal_diagnosis(got[1])
    return code


def compare(learner, bugs, kata, rng, device, cfg, *, dtype=torch.float64, kpm=None, attn=None):
    """Build the learner's module for one config with fresh weights and inputs, call it with the
    case's masks and judge (out, weights) against nn.MultiheadAttention given the same weights."""
    B, Tq, Tk, _, H, _, _ = cfg
    d, kdim, vdim = widths(cfg)
    sd = weights(rng, d, kdim, vdim, dtype)
    query, key, value = inputs(rng, B, Tq, Tk, d, kdim, vdim, dtype)
    loose = kata.tolerance("float32")
    call, case = call_text(cfg, kpm, attn), case_text(cfg, dtype, kpm, attn)
    m = build(learner, device, sd, cfg)
    got = forward(m, query, key, value, kpm, attn)
    pair(got, call=call, case=case)
    expected = torch_mha(sd, H, query, key, value, kpm, attn)
    # Matched within float32 rounding, so that a bug written with a float32 softmax is named too.
    compute = lambda impl: trusted(impl.MultiHeadAttention, sd, H, query, key, value, kpm, attn,
                                   defaults=cfg[5] is None)
    diagnose = lambda: diagnosis(bugs, got, compute, loose, kpm=kpm, attn=attn, Tq=Tq, Tk=Tk)
    judge(got, expected, call=call, case=case, diagnose=diagnose, device=device, against=TORCH_MHA, kata=kata,
          dtype=dtype)


def test_state_dict_keys(learner):
    """the parameters are exactly q_proj, k_proj (kdim -> d_model), v_proj (vdim -> d_model) and out_proj, with biases, all in state_dict"""
    for cfg in (WIDTHS, DEFAULTS):
        d, kdim, vdim = widths(cfg)
        m = construct(learner, cfg)
        info = learner.module_info(m)
        call = constructor(cfg)
        names = list(info["parameters"])
        expect.that(sorted(names) == sorted(KEYS), "The module's parameters are not the kata's.",
                    call=f"{call}.named_parameters()", got=", ".join(names) or "no parameters",
                    expected=", ".join(KEYS) + " (four nn.Linear layers with bias)")
        params = {name: entry[0] for name, entry in info["parameters"].items()}
        expect.that(params == shapes(d, kdim, vdim), "The projections have the wrong shapes.", call=call,
                    got=listing(params), expected=listing(shapes(d, kdim, vdim)) + ": k_proj reads the key's "
                    f"{kdim} channels and v_proj the value's {vdim}" + (" (kdim and vdim default to d_model)"
                                                                      if cfg[5] is None else ""),
                    diagnose=lambda: params_diagnosis(params, d, kdim, vdim))
        missing = [k for k in KEYS if k not in info["state_dict"]]
        expect.that(not missing, "Some parameters are missing from state_dict, so a saved model would lose them.",
                    call=f"{call}.state_dict().keys()", got=", ".join(info["state_dict"]) or "no keys",
                    expected=", ".join(KEYS) + ", and any buffers you register")
    check_untampered(learner, call=f"{call}.state_dict().keys()")


def test_parameter_count(learner):
    """2·d² + d·kdim + d·vdim + 4·d parameters: the key and value projections read kdim and vdim channels"""
    for cfg in (WIDTHS, (2, 5, 7, 12, 3, 16, 5), DEFAULTS):
        d, kdim, vdim = widths(cfg)
        m = construct(learner, cfg)
        params = {name: entry[0] for name, entry in learner.module_info(m)["parameters"].items()}
        count = sum(prod(shape) for shape in params.values())
        want = 2 * d * d + d * kdim + d * vdim + 4 * d
        expect.that(count == want, "The module has the wrong number of parameters.", call=constructor(cfg),
                    got=f"{count:,} ({listing(params)})",
                    expected=f"2·{d}² + {d}·{kdim} + {d}·{vdim} + 4·{d} = {want:,}: q_proj and out_proj {d}x{d}, "
                    f"k_proj {d}x{kdim}, v_proj {d}x{vdim}, a bias of {d} each",
                    diagnose=lambda: params_diagnosis(params, d, kdim, vdim))
    check_untampered(learner, call=constructor(cfg))


def test_matches_torch_mha(learner, bugs, kata, case_rng, rng, device):
    """with injected weights, output and per-head weights equal nn.MultiheadAttention(..., kdim, vdim), masks converted"""
    compare(learner, bugs, kata, rng, device, DEFAULTS)
    B, Tq, Tk = WIDTHS[:3]
    compare(learner, bugs, kata, rng, device, WIDTHS, kpm=padding(case_rng, B, Tk))
    B, Tq, Tk = LONG_QUERIES[:3]
    compare(learner, bugs, kata, rng, device, LONG_QUERIES, kpm=padding(case_rng, B, Tk), attn=pattern(case_rng, Tq=Tq, Tk=Tk))
    B, Tq, Tk = WIDTHS[:3]
    compare(learner, bugs, kata, rng, device, WIDTHS, kpm=padding(case_rng, B, Tk), attn=pattern(case_rng, B, Tq=Tq, Tk=Tk))
    compare(learner, bugs, kata, rng, device, WIDTHS, dtype=torch.float32, attn=pattern(case_rng, Tq=Tq, Tk=Tk))


def test_cross_shapes(learner, device, rng):
    """Tq != Tk: out is (B, Tq, d_model) and the weights (B, n_heads, Tq, Tk), for shorter and longer sources and a single query"""
    # The material's decoder of 25 tokens reading an encoder output of 30, one decoding step, and
    # a source shorter than the target. Only the shapes, dtype and device are judged here.
    for cfg in ((2, 25, 30, 24, 4, None, None), (3, 1, 7, 12, 3, None, None), (2, 9, 4, 20, 2, None, None)):
        B, Tq, Tk, d, H, _, _ = cfg
        sd = weights(rng, d, d, d)
        got = forward(build(learner, device, sd, cfg), *inputs(rng, B, Tq, Tk, d, d, d))
        pair_form(got, cfg, dtype=torch.float64, device=device, call=call_text(cfg), case=case_text(cfg))


def test_padding_keys_get_zero(learner, bugs, kata, case_rng, rng, device):
    """padded keys get weight exactly 0, the real keys' weights sum to 1, and redrawing the padded keys and values changes nothing"""
    tol = kata.tolerance("float64")
    # The first source has the target's length (a padding mask along the wrong axis still runs
    # there), the second another.
    for cfg in ((2, 6, 6, 12, 3, None, None), (3, 5, 8, 20, 2, None, None)):
        B, Tq, Tk, d, H, _, _ = cfg
        sd = weights(rng, d, d, d)
        query, key, value = inputs(rng, B, Tq, Tk, d, d, d)
        kpm = padding(case_rng, B, Tk)
        call, case = call_text(cfg, kpm), case_text(cfg, kpm=kpm)
        m = build(learner, device, sd, cfg)
        got = forward(m, query, key, value, kpm)
        compute = lambda impl: trusted(impl.MultiHeadAttention, sd, H, query, key, value, kpm, defaults=True)
        diagnose = lambda: diagnosis(bugs, got, compute, kata.tolerance("float32"), kpm=kpm, Tq=Tq, Tk=Tk)
        pair_form(got, cfg, dtype=torch.float64, device=device, call=call, case=case)
        w = got[1].cpu()
        padded = ~kpm[:, None, None, :].expand(w.shape)   # (B, H, Tq, Tk)
        leak = padded & (w != 0)
        where = [int(i) for i in leak.nonzero()[0]] if leak.any() else None
        expect.that(where is None, "Padded keys get attention: a key whose key_padding_mask is False must get "
                    "weight exactly 0 from every query.", call=call, case=case,
                    got=f"{int(leak.sum())} of {int(padded.sum())} weights on padded keys are not 0 "
                        f"(first: weights[{', '.join(map(str, where or []))}] = "
                        f"{w[tuple(where)].item() if where else 0:.4g})",
                    expected="weights[b, :, :, j] == 0 wherever key_padding_mask[b, j] is False",
                    diagnose=diagnose)
        sums = w.sum(-1)
        expect.values(sums, torch.ones_like(sums), call=f"{call}[1].sum(-1)", case=case,
                      what="each query's total weight on the real keys", against="1", **tol,
                      float32_inside=expect.float32_inside(kata), diagnose=diagnose)
        key2, value2 = key.clone(), value.clone()
        key2[~kpm], value2[~kpm] = normal(rng, int((~kpm).sum()), d), normal(rng, int((~kpm).sum()), d)
        again = forward(m, query, key2, value2, kpm)
        pair_form(again, cfg, dtype=torch.float64, device=device, call=call, case=case)
        for what, old, new in (("the output", got[0], again[0]), ("the weights", got[1], again[1])):
            problem = expect.mismatch(new, old, **tol)
            expect.that(problem is None, f"Redrawing the padded keys and values changed {what}: padding leaks "
                        "into the result.", call=call, case=case + "; then key and value redrawn at the padded "
                        "positions", got=f"{what} changed: {problem}",
                        expected=f"{what} unchanged: padded positions take no part", diagnose=diagnose)


def scores_like(shape, Tq, Tk):
    return Tq in shape and Tk in shape


def operand_shapes(ops):
    """Shapes of every tensor a recorded call received (einsum and cat may get them as a list)."""
    found = []
    for op in ops:
        for arg in [*op.get("args", []), *op.get("kwargs", {}).values()]:
            for a in arg if isinstance(arg, list) else [arg]:
                if isinstance(a, dict) and isinstance(a.get("shape"), list) and all(type(s) is int for s in a["shape"]):
                    found.append(tuple(a["shape"]))
    return found


def test_cost_linear_in_tk(learner, rng, device):
    """cost linear in Tk: the recorded scores are (B, H, Tq, Tk)-sized and double when the source doubles; nothing is Tk x Tk"""
    # Tk is far larger than every other size, so any tensor with a Tk² term is the largest one
    # recorded (2,304 elements at Tk = 48 against at most 960 for the linear ones).
    cfg = (2, 5, 48, 8, 2, None, None)
    B, Tq, _, d, H, _, _ = cfg
    sd = weights(rng, d, d, d)
    m = build(learner, device, sd, cfg)
    forward(m, *inputs(rng, B, Tq, 7, d, d, d))   # first call: lets lazy imports happen before recording
    recorded_shapes = {}
    for Tk in (48, 96):
        query, key, value = inputs(rng, B, Tq, Tk, d, d, d)   # fresh: no memoised output skips the ops
        with learner.recording() as ops:
            forward(m, query, key, value)
        recorded_shapes[Tk] = operand_shapes(ops)
    call = f"{constructor(cfg)}(query, key, value) with Tk = 48, then Tk = 96"
    case = (f"query ({B}, {Tq}, {d}); key and value ({B}, Tk, {d}), standard normal; n_heads={H}; every torch "
            "call recorded")
    want = f"scores of {B * H * Tq * 48:,} elements, (B, H, Tq, Tk) = ({B}, {H}, {Tq}, 48), then {B * H * Tq * 96:,}"
    scores = {Tk: [s for s in shapes if scores_like(s, Tq, Tk)] for Tk, shapes in recorded_shapes.items()}
    square_queries = any(s.count(Tq) >= 2 for s in recorded_shapes[48])
    expect.that(all(scores.values()), "No score tensor of the queries against the keys was recorded: the scores "
                "must hold one entry per (query, key) pair.", call=call, case=case,
                got="no recorded tensor has both a Tq and a Tk axis", expected=want,
                diagnose=lambda: "kv-from-query" if square_queries else None)
    size = {Tk: max(prod(s) for s in found) for Tk, found in scores.items()}
    expect.that(size[96] == 2 * size[48], "The score tensor does not double when the source doubles.", call=call,
                case=case, got=f"largest score tensor {size[48]:,} elements at Tk = 48, {size[96]:,} at Tk = 96",
                expected=want)
    square = [s for s in recorded_shapes[96] if s.count(96) >= 2]
    expect.that(not square, "A Tk x Tk tensor was built: cross-attention compares queries with keys, never "
                "keys with keys, and its cost must grow linearly with the source.", call=call, case=case,
                got=f"a tensor of shape {square[0]}" if square else None, expected=want)
    largest = {Tk: max(prod(s) for s in shapes) for Tk, shapes in recorded_shapes.items()}
    expect.that(largest[96] <= 2 * largest[48], "Something grows faster than the source: doubling Tk more than "
                "doubles the largest tensor the forward works on.", call=call, case=case,
                got=f"largest tensor {largest[48]:,} elements at Tk = 48, {largest[96]:,} at Tk = 96",
                expected=f"at most twice as large at Tk = 96; {want}")
    check_untampered(learner, call=call, case=case)


def test_rejects_indivisible_heads(learner):
    """d_model % n_heads != 0 raises ValueError or AssertionError"""
    learner.MultiHeadAttention(24, 4)   # a valid configuration builds: only the bad one may raise
    expect.refused(lambda: learner.MultiHeadAttention(24, 5, kdim=10, vdim=7),
                   call="MultiHeadAttention(24, 5, kdim=10, vdim=7)",
                   expected="ValueError (or AssertionError) from __init__: check d_model % n_heads == 0 before "
                            "anything else",
                   raised="5 heads cannot split 24 channels, but the error raised is not the expected one.",
                   returned="5 heads cannot split 24 channels evenly, yet a module was built.")


def test_banned_api(learner, kata, rng, device):
    """no SDPA or nn.MultiheadAttention: attention written by hand"""
    # Only this property: a forward that completes without a library attention, whatever it returns
    # (the default widths and no mask, so that a module wrong about them still runs; the source
    # scan sees a library call on any path).
    B, Tq, Tk, d = DEFAULTS[:4]
    call, case = call_text(DEFAULTS), case_text(DEFAULTS)
    m = build(learner, device, weights(rng, d, d, d), DEFAULTS)
    forward(m, *inputs(rng, B, Tq, Tk, d, d, d))   # first call: lets lazy imports happen before recording
    query, key, value = inputs(rng, B, Tq, Tk, d, d, d)   # fresh: memoised outputs cannot skip the ops
    with learner.recording() as ops:
        forward(m, query, key, value)
    used = banned_used(learner.source, ops, kata.banned)
    expect.that(not used, "The module uses a library attention this kata forbids.", call=call, case=case,
                got=", ".join(used), expected="attention written with matmul, masked_fill and softmax",
                diagnose=lambda: "banned-api")
    check_untampered(learner, call=call, case=case)
