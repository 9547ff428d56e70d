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
        if n_embd % n_head != 0:
            raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        self.n_embd, self.n_head, self.head_dim = n_embd, n_head, n_embd // n_head
        self.dropout, self.flash = dropout, flash
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=False)   # rows stacked [W_q; W_k; W_v]
        self.proj = nn.Linear(n_embd, n_embd, bias=False)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        # A buffer, not a plain attribute: .to(device) moves it with the weights and state_dict
        # saves it, yet it is no parameter. True = this query may attend to this key.
        self.register_buffer("mask", torch.ones(block_size, block_size, dtype=torch.bool).tril())   # (bs, bs)

    def flash_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(B, H, T, hd) each -> (B, H, T, hd) with F.scaled_dot_product_attention."""
        # is_causal=True instead of a mask tensor keeps the call eligible for FlashAttention, and
        # SDPA scales by 1/sqrt(hd) itself. Dropout must follow the module's mode by hand here.
        return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              dropout_p=self.dropout if self.training else 0.0)   # (B, H, T, hd)

    def manual_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(B, H, T, hd) each -> (B, H, T, hd), the scores written out: the function SDPA computes."""
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))   # (B, H, T, T)
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))   # the buffer is block_size wide: slice it to T
        att = self.attn_dropout(F.softmax(att, dim=-1))   # a no-op in eval mode
        return att @ v   # (B, H, T, hd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, n_embd) -> (B, T, n_embd), T <= block_size."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)   # (B, T, C) each
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))   # (B, H, T, hd)
        y = self.flash_attention(q, k, v) if self.flash else self.manual_attention(q, k, v)   # (B, H, T, hd)
        y = y.transpose(1, 2).contiguous().view(B, T, C)   # (B, T, C): heads side by side again
        return self.resid_dropout(self.proj(y))   # (B, T, C)
