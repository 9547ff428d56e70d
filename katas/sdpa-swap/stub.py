import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    """nanoGPT's causal self-attention, with two interchangeable attention paths.

    ``flash=True`` hands the attention to ``F.scaled_dot_product_attention`` (a fused kernel that
    never materialises the (T, T) scores); ``flash=False`` writes it out by hand. Both compute the
    same function of ``x``: ``forward(x)`` maps (B, T, n_embd) to (B, T, n_embd), for any
    T <= block_size.
    """

    def __init__(self, n_embd: int, n_head: int, block_size: int, dropout: float = 0.0, flash: bool = True):
        """Raises ValueError unless ``n_head`` divides ``n_embd``."""
        super().__init__()
        # self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=False)   rows stacked [W_q; W_k; W_v]
        # self.proj = nn.Linear(n_embd, n_embd, bias=False)
        # self.attn_dropout, self.resid_dropout: nn.Dropout(dropout)
        # the causal mask: a buffer named "mask", (block_size, block_size) bool, True = may attend
        raise NotImplementedError("write CausalSelfAttention.__init__")

    def flash_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(B, H, T, hd) each -> (B, H, T, hd) with F.scaled_dot_product_attention."""
        raise NotImplementedError("write flash_attention")

    def manual_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(B, H, T, hd) each -> (B, H, T, hd), the scores written out: the function SDPA computes."""
        raise NotImplementedError("write manual_attention")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, n_embd) -> (B, T, n_embd), T <= block_size."""
        raise NotImplementedError("write forward")
