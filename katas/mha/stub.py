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
        # self.qkv_proj = nn.Linear(d_model, 3 * d_model)   rows stacked [W_q; W_k; W_v]
        # self.out_proj = nn.Linear(d_model, d_model)
        raise NotImplementedError("write MultiHeadSelfAttention.__init__")

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, T, d_model) -> (B, n_heads, T, head_dim): head h owns channels h*head_dim to (h+1)*head_dim."""
        raise NotImplementedError("write split_heads")

    def merge_heads(self, y: torch.Tensor) -> torch.Tensor:
        """(B, n_heads, T, head_dim) -> (B, T, d_model): the inverse of split_heads."""
        raise NotImplementedError("write merge_heads")

    def causal_mask(self, T: int, device=None) -> torch.Tensor:
        """Bool (T, T): True = this query may attend to this key (the SDPA convention)."""
        raise NotImplementedError("write causal_mask")

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Scaled dot-product attention of every head at once: returns (y, weights after dropout)."""
        raise NotImplementedError("write attend")

    def forward(self, x: torch.Tensor, causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, d_model) -> (out (B, T, d_model), weights (B, n_heads, T, T))."""
        raise NotImplementedError("write forward")
