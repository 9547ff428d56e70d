"""cs231n's explicit Jacobians, with the recomputed forward's scores left unscaled: P is softmax(q kᵀ),
not softmax(q kᵀ · scale), while dq and dk are still multiplied by the scale as the chain rule says.
Every weight the gradients use is too sharp."""
import math

import torch
import torch.nn.functional as F


def softmax_backward(p, dp):
    J = torch.diag_embed(p) - p.unsqueeze(-1) @ p.unsqueeze(-2)   # (..., T, T), symmetric
    return (J @ dp.unsqueeze(-1)).squeeze(-1)


def attention_backward(q, k, v, do, scale=None, causal=False):
    d_k = q.size(-1)
    if scale is None:
        scale = 1.0 / math.sqrt(d_k)
    scores = torch.matmul(q, k.transpose(-2, -1))
    if causal:
        n_q, n_k = q.size(-2), k.size(-2)
        mask = torch.tril(torch.ones(n_q, n_k, device=q.device), diagonal=n_k - n_q)
        scores = scores.masked_fill(mask == 0, float("-inf"))
    p_attn = torch.nan_to_num(F.softmax(scores, dim=-1), nan=0.0)
    # out = p_attn @ v: dv = p_attnᵀ @ do, dp_attn = do @ vᵀ
    dv = torch.matmul(p_attn.transpose(-2, -1), do)
    dp_attn = torch.matmul(do, v.transpose(-2, -1))
    dscores = softmax_backward(p_attn, dp_attn)
    # scores = (q @ kᵀ) * scale: dq = dscores @ k * scale, dk = dscoresᵀ @ q * scale
    dq = torch.matmul(dscores, k) * scale
    dk = torch.matmul(dscores.transpose(-2, -1), q) * scale
    return dq, dk, dv
