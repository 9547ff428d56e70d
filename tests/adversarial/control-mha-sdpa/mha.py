# Control: control-mha's module, whose attention is F.scaled_dot_product_attention (banned in this
# kata), called openly: what thread-heads does out of the recorder's sight.
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) is not divisible by n_heads ({n_heads})")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.attn_dropout = nn.Dropout(dropout)

    def split_heads(self, t):
        B, T, _ = t.shape
        return t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)

    def merge_heads(self, y):
        B, H, T, hd = y.shape
        return y.transpose(1, 2).contiguous().view(B, T, H * hd)

    def causal_mask(self, T, device=None):
        return torch.ones(T, T, dtype=torch.bool, device=device).tril()

    def attend(self, q, k, v, causal):
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        if causal:
            att = att.masked_fill(~self.causal_mask(q.size(-2), q.device), float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        p = self.attn_dropout.p if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=p), att

    def forward(self, x, causal=False):
        q, k, v = self.qkv_proj(x).split(self.d_model, dim=-1)
        y, att = self.attend(self.split_heads(q), self.split_heads(k), self.split_heads(v), causal)
        return self.merge_heads(y), att
