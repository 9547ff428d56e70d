"""Known attention-backward bugs, each the reference with exactly that mistake."""
import math

import torch

from reference.attention_backward import softmax_backward


def weights(q, k, scale, causal, *, aligned=True, empty_rows_zero=True, dim=-1):
    """The reference's forward weights P (B, H, Tq, Tk); ``aligned=False`` builds the causal mask
    top-left aligned, ``empty_rows_zero=False`` leaves the NaN rows of queries with no key, ``dim=-2``
    normalises over the queries."""
    Tq, Tk = q.size(-2), k.size(-2)
    s = (q @ k.transpose(-2, -1)) * scale
    if causal:
        allowed = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq if aligned else 0)
        s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, dim=dim)
    if causal and empty_rows_zero:
        p = p.masked_fill(~allowed.any(dim=-1, keepdim=True), 0.0)
    return p


def default(q, scale):
    return 1.0 / math.sqrt(q.size(-1)) if scale is None else scale


def grads(q, k, v, do, p, scale, ds_of=softmax_backward):
    """dq, dk, dv from the weights p, as the reference computes them."""
    dv = p.transpose(-2, -1) @ do
    ds = ds_of(p, do @ v.transpose(-2, -1))
    return (ds @ k) * scale, (ds.transpose(-2, -1) @ q) * scale, dv


def diag_only_softmax_backward(p, dp):
    return p * dp   # only the diagonal of diag(p) - p pᵀ: the -p pᵀ part is gone


def diag_only_attention_backward(q, k, v, do, scale=None, causal=False):
    scale = default(q, scale)
    return grads(q, k, v, do, weights(q, k, scale, causal), scale, diag_only_softmax_backward)


def elementwise_softmax_backward(p, dp):
    return p * (1 - p) * dp   # the derivative of p_i by s_i alone, as if softmax were elementwise


def elementwise_attention_backward(q, k, v, do, scale=None, causal=False):
    scale = default(q, scale)
    return grads(q, k, v, do, weights(q, k, scale, causal), scale, elementwise_softmax_backward)


def queries_weights_backward(q, k, v, do, scale=None, causal=False):
    scale = default(q, scale)
    return grads(q, k, v, do, weights(q, k, scale, causal, dim=-2), scale)   # P normalised over the queries


def queries_softmax_backward(p, dp):
    return p * (dp - (p * dp).sum(dim=-2, keepdim=True))   # the p-weighted mean of dp over the queries


def queries_attention_backward(q, k, v, do, scale=None, causal=False):
    scale = default(q, scale)
    return grads(q, k, v, do, weights(q, k, scale, causal), scale, queries_softmax_backward)


def queries_throughout_backward(q, k, v, do, scale=None, causal=False):
    scale = default(q, scale)
    # P over the queries and its Jacobian over the queries too: the exact gradients of the wrong forward
    return grads(q, k, v, do, weights(q, k, scale, causal, dim=-2), scale, queries_softmax_backward)


def unscaled_grads(q, k, v, do, scale=None, causal=False):
    scale = default(q, scale)
    p = weights(q, k, scale, causal)   # the forward scales the scores ...
    dv = p.transpose(-2, -1) @ do
    ds = softmax_backward(p, do @ v.transpose(-2, -1))
    return ds @ k, ds.transpose(-2, -1) @ q, dv   # ... the gradients of q and k forget it


def unscaled_dq(q, k, v, do, scale=None, causal=False):
    scale = default(q, scale)
    p = weights(q, k, scale, causal)
    dv = p.transpose(-2, -1) @ do
    ds = softmax_backward(p, do @ v.transpose(-2, -1))
    return ds @ k, (ds.transpose(-2, -1) @ q) * scale, dv   # dq without the scale, dk with it


def unscaled_dk(q, k, v, do, scale=None, causal=False):
    scale = default(q, scale)
    p = weights(q, k, scale, causal)
    dv = p.transpose(-2, -1) @ do
    ds = softmax_backward(p, do @ v.transpose(-2, -1))
    return (ds @ k) * scale, ds.transpose(-2, -1) @ q, dv   # dq with the scale, dk without it


def unscaled_scores(q, k, v, do, scale=None, causal=False):
    scale = default(q, scale)
    return grads(q, k, v, do, weights(q, k, 1.0, causal), scale)   # P = softmax(q kᵀ): the forward forgets it


def scores_scaled_twice(q, k, v, do, scale=None, causal=False):
    scale = default(q, scale)
    return grads(q, k, v, do, weights(q, k, scale * scale, causal), scale)   # q scaled, and the scores again


def returned_dk_dq(q, k, v, do, scale=None, causal=False):
    scale = default(q, scale)
    dq, dk, dv = grads(q, k, v, do, weights(q, k, scale, causal), scale)
    return dk, dq, dv   # the gradients of q and k in each other's place


def transposed_on_the_wrong_side(q, k, v, do, scale=None, causal=False):
    scale = default(q, scale)
    p = weights(q, k, scale, causal)
    dv = p.transpose(-2, -1) @ do
    ds = softmax_backward(p, do @ v.transpose(-2, -1))
    # dS pairs queries (rows) with keys (columns): dq needs dS k, dk needs dSᵀ q. Swapped, the
    # shapes only fit when Tq == Tk.
    return (ds.transpose(-2, -1) @ k) * scale, (ds @ q) * scale, dv


def unmasked_scores_grad(q, k, v, do, scale=None, causal=False):
    scale = default(q, scale)
    dv = weights(q, k, scale, causal).transpose(-2, -1) @ do   # dv from the forward's masked P
    p = weights(q, k, scale, False)   # P recomputed for dS without the mask
    ds = softmax_backward(p, do @ v.transpose(-2, -1))
    return (ds @ k) * scale, (ds.transpose(-2, -1) @ q) * scale, dv


def unmasked_values_grad(q, k, v, do, scale=None, causal=False):
    scale = default(q, scale)
    p = weights(q, k, scale, causal)   # dS from the forward's masked P ...
    dv = weights(q, k, scale, False).transpose(-2, -1) @ do   # ... dv from P recomputed without the mask
    ds = softmax_backward(p, do @ v.transpose(-2, -1))
    return (ds @ k) * scale, (ds.transpose(-2, -1) @ q) * scale, dv


def unmasked_backward(q, k, v, do, scale=None, causal=False):
    scale = default(q, scale)
    return grads(q, k, v, do, weights(q, k, scale, False), scale)   # the backward forgets causal


def top_left_backward(q, k, v, do, scale=None, causal=False):
    scale = default(q, scale)
    return grads(q, k, v, do, weights(q, k, scale, causal, aligned=False), scale)   # tril(0): SDPA's is_causal


def nan_rows_backward(q, k, v, do, scale=None, causal=False):
    scale = default(q, scale)
    return grads(q, k, v, do, weights(q, k, scale, causal, empty_rows_zero=False), scale)   # 0/0 rows stay NaN


def forward(q, k, v, scale, causal):
    return weights(q, k, scale, causal) @ v


def autograd_grad(q, k, v, do, scale=None, causal=False):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        return torch.autograd.grad(forward(q, k, v, default(q, scale), causal), (q, k, v), do)


def tensor_backward(q, k, v, do, scale=None, causal=False):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        forward(q, k, v, default(q, scale), causal).backward(do)
    return q.grad, k.grad, v.grad


def func_vjp(q, k, v, do, scale=None, causal=False):
    out, vjp = torch.func.vjp(lambda q, k, v: forward(q, k, v, default(q, scale), causal), q, k, v)
    return vjp(do)


BUGS = {
    "softmax-jacobian-diag-only": [
        {"softmax_backward": diag_only_softmax_backward, "attention_backward": diag_only_attention_backward},
        {"softmax_backward": elementwise_softmax_backward, "attention_backward": elementwise_attention_backward},
    ],
    # The softmax over the queries: in the recomputed forward, in the softmax's backward, or in both.
    "softmax-wrong-dim": [
        {"attention_backward": queries_weights_backward},
        {"softmax_backward": queries_softmax_backward,
         "attention_backward": queries_attention_backward},
        {"softmax_backward": queries_softmax_backward,
         "attention_backward": queries_throughout_backward},
    ],
    "missing-scale-in-grad": [{"attention_backward": unscaled_grads}, {"attention_backward": unscaled_dq},
                              {"attention_backward": unscaled_dk}],
    # The forward's scores scaled wrongly, the gradients carrying the scale once as they should.
    "no-scaling": {"attention_backward": unscaled_scores},
    "double-scale": {"attention_backward": scores_scaled_twice},
    "dk-dq-swapped": [{"attention_backward": returned_dk_dq}, {"attention_backward": transposed_on_the_wrong_side}],
    # The unmasked weights where the backward uses P: in dS, in dv, or in both.
    "causal-grad-leak": [{"attention_backward": unmasked_scores_grad}, {"attention_backward": unmasked_values_grad},
                         {"attention_backward": unmasked_backward}],
    "mask-top-left-aligned": {"attention_backward": top_left_backward},
    "nan-on-fully-masked-row": {"attention_backward": nan_rows_backward},
    "banned-api": [{"attention_backward": autograd_grad}, {"attention_backward": tensor_backward},
                   {"attention_backward": func_vjp}],
}
