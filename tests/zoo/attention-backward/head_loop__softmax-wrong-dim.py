"""The whiteboard loop over batch and heads with the softmax of each (Tq, Tk) score matrix taken over
dim 0, the queries, where dim 1 (the keys) belongs: each key's weights sum to 1 across the queries.
The backward is the right one for weights normalised over the keys."""
import math

import torch


def softmax_backward(p, dp):
    weighted = (p * dp).sum(dim=-1, keepdim=True)
    return p * dp - p * weighted


def head_backward(q, k, v, do, scale, blocked):
    """One head: q (Tq, hd), k (Tk, hd), v (Tk, dv), do (Tq, dv)."""
    s = (q @ k.T) * scale
    if blocked is not None:
        s = s.masked_fill(blocked, -math.inf)
    p = torch.nan_to_num(torch.softmax(s, dim=0))
    dv = p.T @ do
    ds = softmax_backward(p, do @ v.T)
    return ds @ k * scale, ds.T @ q * scale, dv


def attention_backward(q, k, v, do, scale=None, causal=False):
    B, H, Tq, hd = q.shape
    Tk = k.shape[2]
    if scale is None:
        scale = 1 / math.sqrt(hd)
    blocked = None
    if causal:
        blocked = torch.triu(torch.ones(Tq, Tk, dtype=torch.bool, device=q.device), diagonal=Tk - Tq + 1)
    grads = [[head_backward(q[b, h], k[b, h], v[b, h], do[b, h], scale, blocked) for h in range(H)]
             for b in range(B)]
    return tuple(torch.stack([torch.stack([grads[b][h][i] for h in range(H)]) for b in range(B)])
                 for i in range(3))
