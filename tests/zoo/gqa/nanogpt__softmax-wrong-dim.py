"""nanoGPT's idiom grown to grouped-query attention, normalised over the wrong axis:
`F.softmax(att, dim=2)` on the (B, nh, T, T) scores counts axes from the front and lands on the
queries, where nanoGPT's `dim=-1` is the keys.
"""
import math

import torch
import torch.nn as nn
from torch.nn import functional as F

BLOCK_SIZE = 64


def repeat_kv(x, n_rep):
    return x.repeat_interleave(n_rep, dim=1)


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        assert d_model % n_heads == 0
        assert n_heads % n_kv_heads == 0
        self.n_head = n_heads
        self.n_kv_head = n_kv_heads
        self.n_embd = d_model
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * (d_model // n_heads), bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * (d_model // n_heads), bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        self.register_buffer("bias", torch.tril(torch.ones(BLOCK_SIZE, BLOCK_SIZE))
                             .view(1, 1, BLOCK_SIZE, BLOCK_SIZE))

    def forward(self, x, causal=True):
        B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (n_embd)
        hs = C // self.n_head
        q = self.q_proj(x).view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = self.k_proj(x).view(B, T, self.n_kv_head, hs).transpose(1, 2)  # (B, nkv, T, hs)
        v = self.v_proj(x).view(B, T, self.n_kv_head, hs).transpose(1, 2)  # (B, nkv, T, hs)
        k = repeat_kv(k, self.n_head // self.n_kv_head)
        v = repeat_kv(v, self.n_head // self.n_kv_head)

        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if causal:
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=2)
        y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs side by side
        return self.o_proj(y)
