import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MultiHeadSelfAttention(nn.Module):
    """Multi-head self-attention with one fused Q/K/V projection, like GPT-2's.

    ``forward(x, causal)`` returns ``(out, weights)``: out ``(B, T, d_model)`` and the per-head
    attention weights ``(B, n_heads, T, T)`` exactly as applied to V, i.e. after dropout.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        """Raises ValueError unless ``n_heads`` divides ``d_model``."""
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        # q·k sums head_dim products of unit-variance terms: dividing by sqrt(head_dim) keeps the
        # scores at unit variance, so the softmax does not saturate as heads get wider.
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)   # rows stacked [W_q; W_k; W_v]
        self.out_proj = nn.Linear(d_model, d_model)
        self.attn_dropout = nn.Dropout(dropout)

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, T, d_model) -> (B, n_heads, T, head_dim): head h owns channels h*head_dim to (h+1)*head_dim."""
        B, T, C = t.shape
        # view keeps the channel order (head-major); the transpose then moves heads before time.
        return t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)   # (B, H, T, hd)

    def merge_heads(self, y: torch.Tensor) -> torch.Tensor:
        """(B, n_heads, T, head_dim) -> (B, T, d_model): the inverse of split_heads."""
        B, H, T, hd = y.shape
        # after the transpose the memory is no longer (B, T, C)-ordered: contiguous() before view.
        return y.transpose(1, 2).contiguous().view(B, T, H * hd)   # (B, T, C)

    def causal_mask(self, T: int, device=None) -> torch.Tensor:
        """Bool (T, T): True = this query may attend to this key (the SDPA convention)."""
        return torch.ones(T, T, dtype=torch.bool, device=device).tril()   # (T, T), diagonal included

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Scaled dot-product attention of every head at once: returns (y, weights after dropout)."""
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * self.scale   # (B, H, T, T)
        if causal:
            att = att.masked_fill(~self.causal_mask(T, q.device), float("-inf"))
        att = F.softmax(att, dim=-1)   # each query's row is a distribution over the keys
        att = self.attn_dropout(att)   # a no-op in eval mode
        return att @ v, att   # (B, H, T, hd), (B, H, T, T)

    def forward(self, x: torch.Tensor, causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, d_model) -> (out (B, T, d_model), weights (B, n_heads, T, T))."""
        q, k, v = self.qkv_proj(x).split(self.d_model, dim=-1)   # (B, T, C) each
        y, att = self.attend(self.split_heads(q), self.split_heads(k), self.split_heads(v), causal)
        return self.out_proj(self.merge_heads(y)), att   # (B, T, C), (B, H, T, T)
