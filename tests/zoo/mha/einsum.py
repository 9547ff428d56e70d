"""Einsum-heavy attention, as in many research codebases: heads split with view and every product
written as an einsum ("bhqd,bhkd->bhqk", "bhqk,bhkd->bhqd"), the causal mask as a bool tril built
in forward, heads merged by an einsum-free reshape of a permuted tensor.

What a grader could get wrong: an op recorder looking for matmul sees only einsum calls."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"{d_model=} is not a multiple of {n_heads=}")
        self.h, self.dk = n_heads, d_model // n_heads
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, causal=False):
        b, t, d = x.shape
        q, k, v = self.qkv_proj(x).view(b, t, 3, self.h, self.dk).unbind(dim=2)   # (b, t, h, dk) each
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * self.dk ** -0.5
        if causal:
            keep = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~keep, float("-inf"))
        weights = self.drop(F.softmax(scores, dim=-1))
        out = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
        return self.out_proj(out), weights
