"""What every rank's chunk of the ring must equal, written apart from the reference's ring: the
single-process attention of the whole sequence, with its log-sum-exp, on one process."""
import math

import torch


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ / sqrt(head_dim)) v over the whole sequence, q, k, v ``(B, H, T, head_dim)``, a
    query seeing the keys up to its own position when ``causal``: (out like q, lse float32 (B, H, T))."""
    T = q.size(-2)
    scores = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(q.size(-1))   # (B, H, T, T)
    if causal:
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v.double()).to(q.dtype), torch.logsumexp(scores, dim=-1).float()
