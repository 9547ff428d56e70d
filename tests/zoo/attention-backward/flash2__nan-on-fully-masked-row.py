"""FlashAttention-2's equations without the guard for a query that precedes every key: its
logsumexp is -inf, S - L = -inf - (-inf) = NaN, and the NaN reaches dK and dV through the matmuls."""
import math

import torch


def softmax_backward(p, dp):
    D = (p * dp).sum(dim=-1, keepdim=True)   # rowsum(P ∘ dP)
    return p * (dp - D)


def forward(q, k, v, scale, causal):
    """O and the row logsumexp L, as the forward kernel saves them."""
    S = q @ k.transpose(-2, -1) * scale
    if causal:
        Tq, Tk = S.shape[-2:]
        mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq)
        S = S.masked_fill(~mask, float("-inf"))
    L = torch.logsumexp(S, dim=-1, keepdim=True)
    P = torch.exp(S - L)
    return P @ v, L, S


def attention_backward(q, k, v, do, scale=None, causal=False):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    O, L, S = forward(q, k, v, scale, causal)
    P = torch.exp(S - L)   # recomputed from the saved logsumexp
    dV = P.transpose(-2, -1) @ do
    dP = do @ v.transpose(-2, -1)
    D = (do * O).sum(dim=-1, keepdim=True)   # rowsum(dO ∘ O) = rowsum(P ∘ dP)
    dS = P * (dP - D)
    dQ = dS @ k * scale
    dK = dS.transpose(-2, -1) @ q * scale
    return dQ, dK, dV
