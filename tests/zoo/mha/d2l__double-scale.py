"""d2l.ai's MultiHeadAttention, with the queries scaled once more before DotProductAttention,
which scales the scores itself: the scores come out divided by head_dim."""
import math

import torch
from torch import nn


def masked_softmax(X, mask):
    """Softmax over the last axis, with blocked entries (mask False) filled by a large negative."""
    if mask is None:
        return nn.functional.softmax(X, dim=-1)
    X = X.masked_fill(~mask, -1e6)
    return nn.functional.softmax(X, dim=-1)


class DotProductAttention(nn.Module):
    def __init__(self, dropout):
        super().__init__()
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, mask=None):
        d = queries.shape[-1]
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
        self.attention_weights = self.dropout(masked_softmax(scores, mask))
        return torch.bmm(self.attention_weights, values)


def transpose_qkv(X, num_heads):
    X = X.reshape(X.shape[0], X.shape[1], num_heads, -1)
    X = X.permute(0, 2, 1, 3)
    return X.reshape(-1, X.shape[2], X.shape[3])


def transpose_output(X, num_heads):
    X = X.reshape(-1, num_heads, X.shape[1], X.shape[2])
    X = X.permute(0, 2, 1, 3)
    return X.reshape(X.shape[0], X.shape[1], -1)


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        if d_model % n_heads:
            raise ValueError("num_hiddens must be a multiple of num_heads")
        self.num_heads = n_heads
        self.attention = DotProductAttention(dropout)
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, X, causal=False):
        B, T, _ = X.shape
        queries, keys, values = (transpose_qkv(t, self.num_heads) for t in self.qkv_proj(X).chunk(3, dim=-1))
        queries = queries / math.sqrt(queries.shape[-1])
        mask = torch.ones(T, T, dtype=torch.bool, device=X.device).tril() if causal else None
        output = self.attention(queries, keys, values, mask)
        weights = self.attention.attention_weights.reshape(B, self.num_heads, T, T)
        return self.out_proj(transpose_output(output, self.num_heads)), weights
