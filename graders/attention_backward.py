"""Grader of the attention-backward kata (katas/attention-backward/README.md)."""
import torch
import torch.nn.functional as F

from graders.engine import expect
from graders.engine.learner import describe_value
from graders.engine.structure import banned_used, check_untampered

# (B, H, Tq, Tk, hd, dv): B >= 2, H != hd, every T >= 5, so heads, time and channels never mix
# unseen.
SQUARE = (2, 3, 6, 6, 4, 4)       # Tq == Tk: dq and dk share a shape, a swap shows in the values only
WIDE = (2, 2, 5, 7, 3, 3)         # Tq < Tk, as a KV-cache step: dq and dk differ in shape
TALL = (3, 2, 7, 5, 4, 4)         # Tq > Tk: causal leaves queries 0 and 1 before every key
VALUE_WIDTH = (2, 3, 5, 6, 4, 7)  # dv != hd: v and do are wider than q and k
FUTURE = (2, 3, 7, 7, 4, 4)       # the causal property: do only on queries 0..EARLY-1
EARLY = 3
# Central differences step: truncation h²·|f'''| and rounding eps·|L|/h are both ~1e-10 in float64.
STEP = 1e-5
AUTOGRAD = "torch.autograd.grad of F.scaled_dot_product_attention, in float64"


def randn(rng, *shape, dtype=torch.float64):
    return torch.from_numpy(rng.standard_normal(shape)).to(dtype)


def inputs(rng, cfg, dtype=torch.float64):
    """q, k, v and do of a config: four different tensors, unit variance."""
    B, H, Tq, Tk, hd, dv = cfg
    return tuple(randn(rng, B, H, T, w, dtype=dtype) for T, w in ((Tq, hd), (Tk, hd), (Tk, dv), (Tq, dv)))


def allowed(Tq, Tk):
    """The bottom-right aligned causal mask (Tq, Tk), True = may attend: query i sits at Tk - Tq + i."""
    return torch.arange(Tk)[None, :] <= (Tk - Tq + torch.arange(Tq))[:, None]


def forward(q, k, v, scale=None, causal=False):
    """out = softmax(q kᵀ · scale + mask) v by F.scaled_dot_product_attention, an oracle nobody here
    wrote: its math path gives a query without a key zero weights, as the kata asks."""
    mask = allowed(q.size(-2), k.size(-2)).to(q.device) if causal else None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)   # (..., Tq, dv)


def autograd_grads(q, k, v, do, scale=None, causal=False):
    """(dq, dk, dv) by torch.autograd.grad of ``forward`` in float64 on the CPU, cast to q's dtype."""
    leaves = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    with torch.enable_grad():
        out = forward(*leaves, scale=scale, causal=causal)
        grads = torch.autograd.grad(out, leaves, do.detach().cpu().double())
    return tuple(g.to(q.dtype) for g in grads)


def central_differences(q, k, v, do, scale=None, causal=False, h=STEP):
    """(dq, dk, dv) of L = <do, forward(q, k, v)> by central differences, one input entry at a time,
    as torch.autograd.gradcheck's numerical Jacobian: no autograd involved. The perturbed copies are
    stacked on a leading axis, so each tensor costs two forward calls."""
    args = [q, k, v]
    grads = []
    for i, x in enumerate(args):
        n = x.numel()
        step = torch.eye(n, dtype=x.dtype).view(n, *x.shape) * h   # (n, *x.shape)

        def loss(shifted):
            moved = [shifted if j == i else a.expand(n, *a.shape) for j, a in enumerate(args)]
            return (forward(*moved, scale=scale, causal=causal) * do).flatten(1).sum(1)   # (n,)

        grads.append(((loss(x + step) - loss(x - step)) / (2 * h)).view(x.shape))
    return tuple(grads)


def shapes_text(q, k, v, do):
    return (f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, do {tuple(do.shape)}: "
            f"{str(q.dtype).removeprefix('torch.')}, standard normal")


def call_text(scale=None, causal=False) -> str:
    args = ("" if scale is None else f", scale={scale:g}") + (", causal=True" if causal else "")
    return f"attention_backward(q, k, v, do{args})"


def run(learner, q, k, v, do, scale=None, causal=False):
    """The learner's attention_backward, called as a learner calls it: defaults left out."""
    kwargs = ({} if scale is None else {"scale": scale}) | ({"causal": True} if causal else {})
    return learner.attention_backward(q, k, v, do, **kwargs)


def triple(got, *, call, case):
    """attention_backward returned a tuple (dq, dk, dv)."""
    expect.that(type(got) is tuple and len(got) == 3, "attention_backward must return a tuple (dq, dk, dv).",
                call=call, case=case, got=describe_value(got),
                expected="tuple (dq shaped like q, dk shaped like k, dv shaped like v)")


def triple_form(got, q, k, v, *, device, call, case):
    """(dq, dk, dv) shaped like q, k, v, of their dtype, on their device: what property checks need
    before they look at values."""
    triple(got, call=call, case=case)
    for what, value, like in zip(("dq", "dk", "dv"), got, (q, k, v)):
        expect.form(value, torch.Tensor, tuple(like.shape), dtype=like.dtype, device=device, call=call, case=case,
                    what=what)


def diagnosis(bugs, got, q, k, v, do, loose, scale=None, causal=False):
    """The known bug whose gradients on these inputs are ``got``. Matched within float32 rounding:
    every bug moves the gradients by O(1), and a bug computed in float32 inside is still named."""
    kwargs = ({} if scale is None else {"scale": scale}) | ({"causal": True} if causal else {})
    return bugs.match(got, lambda impl: impl.attention_backward(q, k, v, do, **kwargs), **loose)


def check_grads(got, expected, *, call, case, tol, device, diagnose, against=AUTOGRAD, float32_inside=None):
    """(dq, dk, dv) equal ``expected`` in type, shape, dtype, device and values, dq first."""
    triple(got, call=call, case=case)
    for what, value, want in zip(("dq", "dk", "dv"), got, expected):
        expect.array(value, want, call=call, case=case, what=what, device=device, diagnose=diagnose, against=against,
                     float32_inside=float32_inside, **tol)


def graded(learner, bugs, kata, device, q, k, v, do, *, scale=None, causal=False, about=""):
    """The learner's gradients on one case, judged against autograd of SDPA."""
    tol, loose = kata.tolerance(q.dtype), kata.tolerance("float32")
    call, case = call_text(scale, causal), shapes_text(q, k, v, do) + (f"; {about}" if about else "")
    got = run(learner, q, k, v, do, scale, causal)
    check_grads(got, autograd_grads(q, k, v, do, scale, causal), call=call, case=case, tol=tol, device=device,
                diagnose=lambda: diagnosis(bugs, got, q, k, v, do, loose, scale, causal),
                float32_inside=expect.float32_inside(kata, q.dtype))


def probabilities(rng, *shape, dtype=torch.float64):
    """p = softmax(2 z) along the last axis, z standard normal: rows far from uniform."""
    return torch.softmax(2 * randn(rng, *shape), dim=-1).to(dtype)


def test_softmax_backward_values(learner, bugs, kata, rng, device):
    """softmax_backward(p, dp) is the softmax's vector-Jacobian product along the last axis, 2-D to 4-D, float64 and float32"""
    for shape, dtype in (((2, 3, 5, 7), torch.float64), ((4, 9), torch.float64), ((2, 6, 6), torch.float32)):
        p, dp = probabilities(rng, *shape, dtype=dtype), randn(rng, *shape, dtype=dtype)
        tol, loose = kata.tolerance(dtype), kata.tolerance("float32")
        got = learner.softmax_backward(p, dp)
        expect.array(got, bugs.expected.jacobian_product(p, dp), call="softmax_backward(p, dp)",
                     case=f"p {tuple(shape)} = softmax(2·z) along the last axis, dp {tuple(shape)} standard normal; "
                          f"{str(dtype).removeprefix('torch.')}",
                     against="J·dp with each row's Jacobian J = diag(p) - p pᵀ", device=device, **tol,
                     diagnose=lambda: bugs.match(got, lambda impl: impl.softmax_backward(p, dp), **loose),
                     float32_inside=expect.float32_inside(kata, dtype))


def test_matches_autograd(learner, bugs, kata, rng, device):
    """(dq, dk, dv) equal autograd's: Tq == Tk and Tq < Tk, float64 and float32"""
    for cfg, dtype in ((SQUARE, torch.float64), (WIDE, torch.float64), (WIDE, torch.float32)):
        graded(learner, bugs, kata, device, *inputs(rng, cfg, dtype))


def test_gradcheck(learner, bugs, kata, rng, device):
    """(dq, dk, dv) equal central differences of the forward, one entry at a time (no autograd), with v wider than q"""
    q, k, v, do = inputs(rng, VALUE_WIDTH)
    # The float32 tolerance: central differences in float64 are right to ~1e-9 here, four orders
    # below it, and every bug moves the gradients by O(1).
    tol, loose = kata.tolerance("float32"), kata.tolerance("float32")
    call = call_text()
    case = shapes_text(q, k, v, do) + f"; dv = {v.size(-1)} != hd = {q.size(-1)}"
    got = run(learner, q, k, v, do)
    check_grads(got, central_differences(q, k, v, do), call=call, case=case, tol=tol, device=device,
                against=f"central differences (L(x + h) - L(x - h)) / 2h of L = <do, out>, h = {STEP:g}",
                diagnose=lambda: diagnosis(bugs, got, q, k, v, do, loose))


def test_custom_scale(learner, bugs, kata, rng, device):
    """a given scale is the one in the forward and in the gradients"""
    for cfg, scale in ((WIDE, 0.3), (SQUARE, 1.7)):
        graded(learner, bugs, kata, device, *inputs(rng, cfg), scale=scale,
               about=f"scale={scale:g} given: the scores are q kᵀ · {scale:g}, not q kᵀ / sqrt(hd)")


def test_causal_matches(learner, bugs, kata, rng, device):
    """causal=True equals autograd under the bottom-right mask: Tq == Tk, Tq < Tk, Tq > Tk (a query without a key gets zero gradients)"""
    for cfg in (SQUARE, WIDE, TALL):
        B, H, Tq, Tk, hd, dv = cfg
        offset = "" if Tq == Tk else f" + {Tk - Tq}" if Tk > Tq else f" - {Tq - Tk}"
        about = f"causal: query i sits at position i{offset}"
        if Tq > Tk:
            about += f"; queries 0..{Tq - Tk - 1} precede every key: zero output, zero gradients"
        graded(learner, bugs, kata, device, *inputs(rng, cfg), causal=True, about=about)


def test_causal_no_grad_from_future(learner, bugs, kata, rng, device):
    """causal=True: keys only later queries see get no gradient from earlier ones, nor change their dq"""
    q, k, v, do = inputs(rng, FUTURE)
    do[..., EARLY:, :] = 0   # only queries 0..EARLY-1 have an upstream gradient
    tol, loose = kata.tolerance("float64"), kata.tolerance("float32")
    call = call_text(causal=True)
    case = shapes_text(q, k, v, do) + f"; do is 0 on queries {EARLY}..{FUTURE[2] - 1}"
    got = run(learner, q, k, v, do, causal=True)
    triple_form(got, q, k, v, device=device, call=call, case=case)
    diagnose = lambda: diagnosis(bugs, got, q, k, v, do, loose, causal=True)
    for what, value in (("dk", got[1]), ("dv", got[2])):
        future = value[..., EARLY:, :]
        expect.values(future, torch.zeros_like(future), call=call, case=case,
                      what=f"{what} of keys {EARLY}..{FUTURE[3] - 1} (seen only by queries {EARLY}.., whose do is 0)",
                      against="0",
                      diagnose=diagnose, float32_inside=expect.float32_inside(kata), **tol)
    k2, v2 = k.clone(), v.clone()
    k2[..., EARLY:, :], v2[..., EARLY:, :] = randn(rng, *k[..., EARLY:, :].shape), randn(rng, *v[..., EARLY:, :].shape)
    again = run(learner, q, k2, v2, do, causal=True)
    triple_form(again, q, k2, v2, device=device, call=call, case=case)
    problem = expect.mismatch(again[0][..., :EARLY, :], got[0][..., :EARLY, :], **tol)
    expect.that(problem is None, f"With causal=True, redrawing keys and values {EARLY}..{FUTURE[3] - 1} changed dq "
                f"of queries 0..{EARLY - 1}: gradient flows through pairs the mask hides.", call=call,
                case=case + f"; then k and v redrawn at positions {EARLY}..{FUTURE[3] - 1}",
                got=f"dq[..., :{EARLY}, :] changed: {problem}",
                expected=f"dq[..., :{EARLY}, :] unchanged: query i only reads keys j <= i",
                diagnose=lambda: bugs.match((got, again), lambda impl: tuple(
                    impl.attention_backward(q, kk, vv, do, causal=True) for kk, vv in ((k, v), (k2, v2))), **loose))


def test_banned_api(learner, kata, rng, device):
    """no autograd (torch.autograd, .backward(), torch.func) and no library softmax backward: the gradients written by hand"""
    # Only this property, on the square shape: a backward wrong about shapes (a transpose on the
    # wrong side) still runs there; the source scan sees a banned name on any path.
    q, k, v, do = inputs(rng, SQUARE)
    call = f"{call_text(causal=True)} and softmax_backward(p, dp)"
    case = shapes_text(q, k, v, do) + "; p, dp of the scores' shape; every torch call recorded"
    run(learner, q, k, v, do, causal=True)   # first call: lets lazy imports happen before recording
    q, k, v, do = inputs(rng, SQUARE)   # fresh: memoised outputs cannot skip the ops
    p, dp = probabilities(rng, *SQUARE[:4]), randn(rng, *SQUARE[:4])
    with learner.recording() as ops:
        run(learner, q, k, v, do, causal=True)
        learner.softmax_backward(p, dp)
    used = banned_used(learner.source, ops, kata.banned)
    expect.that(not used, "Your code uses autograd or a library backward, which this kata forbids.", call=call,
                case=case, got=", ".join(used),
                expected="the gradients written with matmul, transpose, sum and the softmax's Jacobian",
                diagnose=lambda: "banned-api")
    check_untampered(learner, call=call, case=case)
