"""RoPE as RoFormer's block-diagonal rotation matrices, applied with einsum, and the attention
scores left as the einsum gives them: q·k over head_dim products, never divided by sqrt(head_dim).
"""
import math

import torch
import torch.nn as nn


def rope_cache(T, head_dim, base=10000.0, dtype=torch.float32):
    if head_dim % 2 != 0:
        raise ValueError("head_dim must be even")
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    theta = torch.exp(-2 * i / head_dim * math.log(base))
    angles = torch.einsum("t,i->ti", torch.arange(T, dtype=torch.float64), theta)
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


def rotation_matrices(cos, sin):
    return torch.stack([torch.stack([cos, -sin], dim=-1), torch.stack([sin, cos], dim=-1)], dim=-2)   # (T, hd/2, 2, 2)


def apply_rope(x, cos, sin, positions):
    R = rotation_matrices(cos[positions], sin[positions]).to(torch.promote_types(x.dtype, cos.dtype))
    pairs = x.unflatten(-1, (-1, 2)).to(R.dtype)   # (B, H, T, hd/2, 2)
    return torch.einsum("tiab,nhtib->nhtia", R, pairs).flatten(-2).to(x.dtype)


class RoPEAttention(nn.Module):
    def __init__(self, d_model, n_heads, max_len=2048, base=10000.0):
        super().__init__()
        if d_model % n_heads != 0 or (d_model // n_heads) % 2 != 0:
            raise ValueError(f"need an even head size, got d_model={d_model}, n_heads={n_heads}")
        self.h, self.d = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        cos, sin = rope_cache(max_len, self.d, base, dtype=torch.float64)
        self.register_buffer("cos_cached", cos, persistent=False)
        self.register_buffer("sin_cached", sin, persistent=False)

    def forward(self, x, past_kv=None):
        B, T, _ = x.shape
        n = 0 if past_kv is None else past_kv[0].shape[2]
        pos = torch.arange(n, n + T, device=x.device)
        q, k, v = (torch.einsum("btc,dc->btd", x, p.weight).view(B, T, self.h, self.d).permute(0, 2, 1, 3)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        q = apply_rope(q, self.cos_cached, self.sin_cached, pos)
        k = apply_rope(k, self.cos_cached, self.sin_cached, pos)
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], 2), torch.cat([past_kv[1], v], 2)
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k)
        future = torch.arange(n + T, device=x.device)[None, :] > pos[:, None]
        scores = scores + torch.zeros(T, n + T, dtype=x.dtype, device=x.device).masked_fill(future, -math.inf)
        y = torch.einsum("bhqk,bhkd->bqhd", scores.softmax(-1), v).reshape(B, T, self.h * self.d)
        return self.o_proj(y), (k, v)
