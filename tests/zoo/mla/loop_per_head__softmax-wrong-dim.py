"""A hand-rolled loop over heads as in loop_per_head.py, with each head's softmax over dim 1 of its
(B, T, Tk) scores: the queries, not the keys. Every key's weights then sum to 1 over the queries,
and a decoded token's single query gives every cached key the weight 1."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def mla_cache_bytes_per_token(kv_lora_rank, qk_rope_dim, n_layers=1, dtype_bytes=2):
    total = 0
    for _ in range(n_layers):
        total += (kv_lora_rank + qk_rope_dim) * dtype_bytes
    return total


def kv_cache_bytes_per_token(n_kv_heads, head_dim, n_layers=1, dtype_bytes=2):
    keys = values = n_kv_heads * head_dim * dtype_bytes
    return (keys + values) * n_layers


def rotate(x, start):
    """x (B, T, d): pair (x[2i], x[2i+1]) of token t turned by (start + t) * 10000^(-2i/d)."""
    T, d = x.shape[1], x.shape[2]
    angles = [[(start + t) * 10000.0 ** (-2 * i / d) for i in range(d // 2)] for t in range(T)]
    cos = torch.tensor([[math.cos(a) for a in row] for row in angles], dtype=x.dtype, device=x.device)
    sin = torch.tensor([[math.sin(a) for a in row] for row in angles], dtype=x.dtype, device=x.device)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).reshape(x.shape)


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, d_model, n_heads, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_dim):
        super().__init__()
        self.h, self.r = n_heads, kv_lora_rank
        self.dn, self.dr, self.dv = qk_nope_dim, qk_rope_dim, v_dim
        self.wq = nn.Linear(d_model, n_heads * (qk_nope_dim + qk_rope_dim), bias=False)
        self.wkv_a = nn.Linear(d_model, kv_lora_rank + qk_rope_dim, bias=False)
        self.wkv_b = nn.Linear(kv_lora_rank, n_heads * (qk_nope_dim + v_dim), bias=False)
        self.wo = nn.Linear(n_heads * v_dim, d_model, bias=False)

    def forward(self, x, cache=None, absorb=False):
        B, T, _ = x.shape
        start = 0 if cache is None else cache[0].shape[1]
        down = self.wkv_a(x)
        c_kv, k_r = down[..., :self.r], rotate(down[..., self.r:], start)
        if cache is not None:
            c_kv = torch.cat([cache[0], c_kv], dim=1)
            k_r = torch.cat([cache[1], k_r], dim=1)
        Tk = c_kv.shape[1]
        q_all = self.wq(x)
        qd, kd = self.dn + self.dr, self.dn + self.dv
        q_pos = torch.arange(start, start + T, device=x.device)
        future = torch.arange(Tk, device=x.device)[None, :] > q_pos[:, None]
        outs = []
        for i in range(self.h):
            q_h = q_all[..., i * qd:(i + 1) * qd]
            q_n, q_r = q_h[..., :self.dn], rotate(q_h[..., self.dn:], start)
            W_uk = self.wkv_b.weight[i * kd:i * kd + self.dn]   # (dn, r)
            W_uv = self.wkv_b.weight[i * kd + self.dn:(i + 1) * kd]   # (dv, r)
            if absorb:
                s = (q_n @ W_uk) @ c_kv.transpose(1, 2) + q_r @ k_r.transpose(1, 2)
            else:
                s = q_n @ (c_kv @ W_uk.T).transpose(1, 2) + q_r @ k_r.transpose(1, 2)
            s = s / math.sqrt(qd)
            p = F.softmax(s.masked_fill(future, float("-inf")), dim=1)
            if absorb:
                outs.append((p @ c_kv) @ W_uv.T)
            else:
                outs.append(p @ (c_kv @ W_uv.T))
        return self.wo(torch.cat(outs, dim=-1)), (c_kv, k_r)
