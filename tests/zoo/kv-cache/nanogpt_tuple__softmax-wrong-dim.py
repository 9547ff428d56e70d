"""nanoGPT's idiom with the softmax taken over dim=2 of the (B, H, T, Tk) scores, the new queries,
where the keys are dim 3 (-1): each key's column is normalised over the queries. A single decoded
token is the only query of its call, so every key gets weight 1 and its output is the sum of the
values (softmax-wrong-dim)."""
import math

import torch
import torch.nn as nn
from torch.nn import functional as F


class KVCache:
    def __init__(self):
        self.kv = None

    def append(self, k, v):
        if self.kv is not None:
            past_k, past_v = self.kv
            k = torch.cat((past_k, k), dim=-2)
            v = torch.cat((past_v, v), dim=-2)
        self.kv = (k, v)
        return self.kv

    def reset(self):
        self.kv = None

    def __len__(self):
        return 0 if self.kv is None else self.kv[0].size(-2)


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, block_size=128):
        super().__init__()
        assert d_model % n_heads == 0, f"n_embd {d_model} is not a multiple of n_head {n_heads}"
        assert n_heads % n_kv_heads == 0, f"n_head {n_heads} is not a multiple of n_kv_head {n_kv_heads}"
        self.n_head, self.n_kv_head, self.n_embd = n_heads, n_kv_heads, d_model
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model // n_heads * n_kv_heads, bias=False)
        self.v_proj = nn.Linear(d_model, d_model // n_heads * n_kv_heads, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x, cache=None, start_pos=0):
        past = 0 if cache is None else len(cache)
        assert start_pos == past, f"start_pos {start_pos} but {past} tokens cached"
        B, T, C = x.size()
        hs = C // self.n_head
        q = self.q_proj(x).view(B, T, self.n_head, hs).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_head, hs).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_head, hs).transpose(1, 2)
        if cache is not None:
            k, v = cache.append(k, v)
        Tk = k.size(-2)
        k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, Tk - T:Tk, :Tk] == 0, float("-inf"))
        att = F.softmax(att, dim=2)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.o_proj(y)
