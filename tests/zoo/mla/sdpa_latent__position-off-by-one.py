"""FlashMLA's layout through F.scaled_dot_product_attention as in sdpa_latent.py (the absorbed
decode as one attention over [c_kv | k_rope] with values c_kv, then W_uv; the naive path as SDPA
on explicit keys), with the tokens after a cache counted one late: after n cached tokens the next
is placed at n + 1 (`past = cache[0].shape[1] + 1`), so the decoded queries and keys are turned one
position too far while the cached keys stay at theirs."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def mla_cache_bytes_per_token(kv_lora_rank, qk_rope_dim, n_layers=1, dtype_bytes=2):
    return n_layers * (kv_lora_rank * dtype_bytes + qk_rope_dim * dtype_bytes)


def kv_cache_bytes_per_token(n_kv_heads, head_dim, n_layers=1, dtype_bytes=2):
    return n_layers * 2 * n_kv_heads * head_dim * dtype_bytes


def rope(x, pos, dim):
    theta = 10000.0 ** (-torch.arange(0, dim, 2, device=x.device, dtype=torch.float64) / dim)
    ang = pos[:, None].double() * theta
    c, s = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    if x.dim() == 4:
        c, s = c[:, None], s[:, None]
    xr = x.unflatten(-1, (dim // 2, 2))
    a, b = xr[..., 0], xr[..., 1]
    return torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, d_model, n_heads, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_dim):
        super().__init__()
        self.n_heads, self.rank = n_heads, kv_lora_rank
        self.nope, self.rope, self.v_dim = qk_nope_dim, qk_rope_dim, v_dim
        self.wq = nn.Linear(d_model, n_heads * (qk_nope_dim + qk_rope_dim), bias=False)
        self.wkv_a = nn.Linear(d_model, kv_lora_rank + qk_rope_dim, bias=False)
        self.wkv_b = nn.Linear(kv_lora_rank, n_heads * (qk_nope_dim + v_dim), bias=False)
        self.wo = nn.Linear(n_heads * v_dim, d_model, bias=False)

    def forward(self, x, cache=None, absorb=False):
        B, T, _ = x.shape
        H = self.n_heads
        past = cache[0].shape[1] + 1 if cache is not None else 0   # the next token's position
        pos = torch.arange(past, past + T, device=x.device)
        q = self.wq(x).view(B, T, H, -1).transpose(1, 2)   # (B, H, T, nope + rope)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        q_pe = rope(q_pe.transpose(1, 2), pos, self.rope).transpose(1, 2)
        ckv, kpe = self.wkv_a(x).split([self.rank, self.rope], dim=-1)
        kpe = rope(kpe, pos, self.rope)
        if cache is not None:
            ckv = torch.cat((cache[0], ckv), 1)
            kpe = torch.cat((cache[1], kpe), 1)
        S = ckv.shape[1]
        allowed = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(S - T)
        scale = 1.0 / math.sqrt(self.nope + self.rope)
        w = self.wkv_b.weight.unflatten(0, (H, self.nope + self.v_dim))   # (H, nope + v, rank)
        if absorb:
            q_lat = q_nope @ w[:, :self.nope]   # (B, H, T, rank)
            qq = torch.cat((q_lat, q_pe), -1)
            kk = torch.cat((ckv, kpe), -1)[:, None].expand(B, H, S, self.rank + self.rope)
            vv = ckv[:, None].expand(B, H, S, self.rank)
            o_lat = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=allowed, scale=scale)
            o = o_lat @ w[:, self.nope:].transpose(-1, -2)   # (B, H, T, v)
        else:
            kv = self.wkv_b(ckv).view(B, S, H, -1).transpose(1, 2)
            k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
            k = torch.cat((k_nope, kpe[:, None].expand(B, H, S, self.rope)), -1)
            o = F.scaled_dot_product_attention(torch.cat((q_nope, q_pe), -1), k, v, attn_mask=allowed, scale=scale)
        return self.wo(o.transpose(1, 2).reshape(B, T, -1)), (ckv, kpe)
