"""The backward pass of softmax and of scaled dot-product attention, by hand
(katas/attention-backward/README.md).

Masks follow F.scaled_dot_product_attention: True = this query may attend to this key.
"""
import math

import torch


def softmax_backward(p: torch.Tensor, dp: torch.Tensor) -> torch.Tensor:
    """The gradient ``ds = dL/ds`` of the scores, given ``p = softmax(s, dim=-1)`` and ``dp = dL/dp``.

    The softmax's vector-Jacobian product along the last axis, with every entry of a row depending
    on every score of that row. Same shape and dtype as ``p``; each row of ``ds`` sums to 0.
    """
    # Row Jacobian diag(p) - p pᵀ: the off-diagonal part subtracts the p-weighted mean of dp.
    return p * (dp - (p * dp).sum(dim=-1, keepdim=True))   # (..., T)


def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, scale: float | None = None,
                       causal: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of ``out = softmax(q kᵀ · scale + mask) v`` given ``do = dL/dout``, without autograd.

    q ``(B, H, Tq, hd)``, k ``(B, H, Tk, hd)``, v ``(B, H, Tk, dv)``, do ``(B, H, Tq, dv)``.
    ``scale=None`` means ``1/sqrt(hd)``. ``causal`` masks bottom-right aligned: query i sits at
    position ``Tk - Tq + i`` and sees the keys at or before it; a query before every key
    (``Tq > Tk``) has a zero output and zero gradients. Returns tensors shaped like q, k and v.
    """
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    Tq, Tk = q.size(-2), k.size(-2)
    # The forward, recomputed: the backward needs its weights P, not its output.
    s = (q @ k.transpose(-2, -1)) * scale   # (B, H, Tq, Tk)
    if causal:
        allowed = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq)   # (Tq, Tk)
        s = s.masked_fill(~allowed, float("-inf"))   # (B, H, Tq, Tk)
    p = torch.softmax(s, dim=-1)   # (B, H, Tq, Tk)
    if causal:
        # A row of -inf softmaxes to 0/0 = NaN; a query with no key has zero weights instead.
        p = p.masked_fill(~allowed.any(dim=-1, keepdim=True), 0.0)   # (B, H, Tq, Tk)
    dv = p.transpose(-2, -1) @ do   # (B, H, Tk, dv): key j collects the do of every query that read it
    dp = do @ v.transpose(-2, -1)   # (B, H, Tq, Tk)
    ds = softmax_backward(p, dp)   # (B, H, Tq, Tk); 0 wherever p is 0, so masked pairs pass nothing back
    dq = (ds @ k) * scale   # (B, H, Tq, hd): the scale multiplied s, so it multiplies both its gradients
    dk = (ds.transpose(-2, -1) @ q) * scale   # (B, H, Tk, hd)
    return dq, dk, dv
