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
    raise NotImplementedError("write softmax_backward")


def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, scale: float | None = None,
                       causal: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of ``out = softmax(q kᵀ · scale + mask) v`` given ``do = dL/dout``, without autograd.

    q ``(B, H, Tq, hd)``, k ``(B, H, Tk, hd)``, v ``(B, H, Tk, dv)``, do ``(B, H, Tq, dv)``.
    ``scale=None`` means ``1/sqrt(hd)``. ``causal`` masks bottom-right aligned: query i sits at
    position ``Tk - Tq + i`` and sees the keys at or before it; a query before every key
    (``Tq > Tk``) has a zero output and zero gradients. Returns tensors shaped like q, k and v.
    """
    raise NotImplementedError("write attention_backward")
