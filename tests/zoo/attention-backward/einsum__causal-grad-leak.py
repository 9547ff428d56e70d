"""The einsum backward whose dv recomputes the weights without the causal mask: ds, dq and dk use the
masked p, but dv = pᵀ do takes the plain softmax of the scores, so keys only later queries may see
receive the gradient of earlier ones."""
import torch


def softmax_backward(p, dp):
    return p * (dp - torch.einsum("...k,...k->...", p, dp).unsqueeze(-1))


def attention_backward(q, k, v, do, scale=None, causal=False):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if causal:
        Tq, Tk = q.shape[-2], k.shape[-2]
        i = torch.arange(Tq, device=q.device)[:, None] + (Tk - Tq)
        j = torch.arange(Tk, device=q.device)[None, :]
        s = s.masked_fill(j > i, float("-inf"))
    p = torch.softmax(s, dim=-1)
    p = torch.where(torch.isnan(p), torch.zeros_like(p), p)   # a query before every key
    dv = torch.einsum("bhqk,bhqd->bhkd", torch.softmax(torch.einsum("bhqd,bhkd->bhqk", q, k) * scale, dim=-1), do)
    dp = torch.einsum("bhqd,bhkd->bhqk", do, v)
    ds = softmax_backward(p, dp)
    dq = torch.einsum("bhqk,bhkd->bhqd", ds, k) * scale
    dk = torch.einsum("bhqk,bhqd->bhkd", ds, q) * scale
    return dq, dk, dv
