"""The single-process layer the tensor-parallel one must equal, written apart from the reference's
attend(): nanoGPT's CausalSelfAttention with grouped KV heads and the fused [W_q; W_k; W_v] rows."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    """The single-process module that the tensor-parallel one splits: causal self-attention with
    nanoGPT's fused ``c_attn`` (rows ``[W_q; W_k; W_v]``: n_heads*head_dim query rows, then
    n_kv_heads*head_dim key rows and as many value rows, with a bias) and ``c_proj`` (with a bias).
    Query head ``j`` reads key/value head ``j // (n_heads // n_kv_heads)``; scale 1/sqrt(head_dim).
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int):
        """Raises ValueError unless ``n_heads`` divides ``d_model`` and ``n_kv_heads`` divides ``n_heads``."""
        super().__init__()
        if d_model % n_heads != 0 or n_heads % n_kv_heads != 0:
            raise ValueError(f"need n_heads | d_model and n_kv_heads | n_heads: {d_model}, {n_heads}, {n_kv_heads}")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.c_attn = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * self.head_dim)   # rows [W_q; W_k; W_v]
        self.c_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, d_model) -> (B, T, d_model)."""
        B, T, C = x.shape
        H, Hkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = self.c_attn(x).split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
        q = q.view(B, T, H, hd).transpose(1, 2)   # (B, H, T, hd)
        k = k.view(B, T, Hkv, hd).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)   # (B, H, T, hd)
        v = v.view(B, T, Hkv, hd).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)   # (B, H, T, hd)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)   # (B, H, T, T)
        att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=x.device).tril(), float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)   # (B, T, C)
        return self.c_proj(y)   # (B, T, C)
