"""The chunk-list cache and per-group loop, with the mask built square as Llama's original code
did, `torch.triu(ones(T, T), diagonal=start_pos + 1)` for the future, then padded with start_pos
columns of False in front for the cached keys, as the later fix's `torch.hstack` does: the padding
broadcasts, but the diagonal start_pos + 1 belongs to a (T, Tk) mask, so inside the chunk query i
sees the chunk's tokens up to i + start_pos, after it (square-chunk-mask)."""
import math

import torch
import torch.nn as nn


class KVCache:
    def __init__(self):
        self.ks, self.vs = [], []

    def append(self, k, v):
        self.ks.append(k)
        self.vs.append(v)
        return torch.cat(self.ks, dim=2), torch.cat(self.vs, dim=2)

    def reset(self):
        self.ks, self.vs = [], []

    def __len__(self):
        return sum(k.shape[2] for k in self.ks)


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(f"d_model={d_model}, n_heads={n_heads}, n_kv_heads={n_kv_heads} do not divide")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, cache=None, start_pos=0):
        if start_pos != (len(cache) if cache is not None else 0):
            raise ValueError(f"start_pos {start_pos} does not follow the {len(cache) if cache else 0} cached tokens")
        B, T, C = x.shape
        hd, n_rep = self.head_dim, self.n_heads // self.n_kv_heads
        q = self.q_proj(x).reshape(B, T, self.n_heads, hd).permute(0, 2, 1, 3)
        k = self.k_proj(x).reshape(B, T, self.n_kv_heads, hd).permute(0, 2, 1, 3)
        v = self.v_proj(x).reshape(B, T, self.n_kv_heads, hd).permute(0, 2, 1, 3)
        if cache is not None:
            k, v = cache.append(k, v)
        Tk = k.shape[2]
        future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=start_pos + 1)
        future = torch.cat([torch.zeros(T, start_pos, dtype=torch.bool, device=x.device), future], dim=1)
        outs = []
        for g in range(self.n_kv_heads):
            qg = q[:, g * n_rep:(g + 1) * n_rep]   # (B, n_rep, T, hd): the query heads of KV head g
            scores = qg @ k[:, g:g + 1].transpose(-2, -1) / math.sqrt(hd)
            weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            outs.append(weights @ v[:, g:g + 1])
        y = torch.cat(outs, dim=1)
        return self.o_proj(y.permute(0, 2, 1, 3).reshape(B, T, C))
