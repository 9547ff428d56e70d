"""The Annotated Transformer's `attention(query, key, value, mask, dropout)` and
MultiHeadedAttention, with the scores never divided by sqrt(d_k)."""

import torch
import torch.nn as nn


def attention(query, key, value, mask=None, dropout=None):
    "Compute 'Scaled Dot Product Attention'"
    scores = torch.matmul(query, key.transpose(-2, -1))
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0):
        "Take in model size and number of heads."
        super().__init__()
        assert d_model % n_heads == 0
        self.d_k = d_model // n_heads
        self.h = n_heads
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.attn = None
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, x, causal=False):
        nbatches, T = x.size(0), x.size(1)
        mask = torch.tril(torch.ones(1, T, T, device=x.device)).unsqueeze(1) if causal else None
        query, key, value = [
            t.view(nbatches, -1, self.h, self.d_k).transpose(1, 2) for t in self.qkv_proj(x).chunk(3, dim=-1)
        ]
        x, self.attn = attention(query, key, value, mask=mask, dropout=self.dropout)
        x = x.transpose(1, 2).contiguous().view(nbatches, -1, self.h * self.d_k)
        return self.out_proj(x), self.attn
