"""The einsum style with the forward's scores scaled twice: q is multiplied by the scale inside the
einsum and the scores by it again, so P is softmax(q kᵀ · scale²) while the gradients carry the scale
once."""
import torch


def softmax_backward(p, dp):
    return p * (dp - torch.einsum("...k,...k->...", p, dp).unsqueeze(-1))


def attention_backward(q, k, v, do, scale=None, causal=False):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = torch.einsum("bhqd,bhkd->bhqk", q * scale, k) * scale
    if causal:
        Tq, Tk = q.shape[-2], k.shape[-2]
        i = torch.arange(Tq, device=q.device)[:, None] + (Tk - Tq)
        j = torch.arange(Tk, device=q.device)[None, :]
        s = s.masked_fill(j > i, float("-inf"))
    p = torch.softmax(s, dim=-1)
    p = torch.where(torch.isnan(p), torch.zeros_like(p), p)   # a query before every key
    dv = torch.einsum("bhqk,bhqd->bhkd", p, do)
    dp = torch.einsum("bhqd,bhkd->bhqk", do, v)
    ds = softmax_backward(p, dp)
    dq = torch.einsum("bhqk,bhkd->bhqd", ds, k) * scale
    dk = torch.einsum("bhqk,bhqd->bhkd", ds, q) * scale
    return dq, dk, dv
