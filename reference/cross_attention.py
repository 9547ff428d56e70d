import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MultiHeadAttention(nn.Module):
    """Multi-head attention whose queries come from one sequence and whose keys and values come
    from another: the cross-attention of an encoder–decoder, in which the decoder's tokens
    (``query``) attend to the encoder's output (``key``, ``value``). Self-attention is the case
    ``key = value = query``.

    ``forward`` returns ``(out, weights)``: out ``(B, Tq, d_model)`` and the per-head attention
    weights ``(B, n_heads, Tq, Tk)``. Masks are bool, True = this query MAY attend to this key.
    """

    def __init__(self, d_model: int, n_heads: int, kdim: int | None = None, vdim: int | None = None):
        """Raises ValueError unless ``n_heads`` divides ``d_model``. ``kdim`` and ``vdim``, the
        widths of ``key`` and ``value``, default to ``d_model``."""
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        kdim = d_model if kdim is None else kdim
        vdim = d_model if vdim is None else vdim
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        # q·k sums head_dim products: 1/sqrt(head_dim) keeps the scores at unit variance.
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.q_proj = nn.Linear(d_model, d_model)
        # keys and values are read from the other sequence, so their inputs have its widths.
        self.k_proj = nn.Linear(kdim, d_model)
        self.v_proj = nn.Linear(vdim, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, T, d_model) -> (B, n_heads, T, head_dim): head h owns channels h*head_dim to (h+1)*head_dim."""
        B, T, _ = t.shape
        return t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)   # (B, H, T, hd)

    def merge_heads(self, y: torch.Tensor) -> torch.Tensor:
        """(B, n_heads, T, head_dim) -> (B, T, d_model): the inverse of split_heads."""
        B, H, T, hd = y.shape
        return y.transpose(1, 2).contiguous().view(B, T, H * hd)   # (B, T, C)

    def combine_masks(self, key_padding_mask: torch.Tensor | None,
                      attn_mask: torch.Tensor | None) -> torch.Tensor | None:
        """key_padding_mask (B, Tk) and attn_mask (Tq, Tk) or (B, Tq, Tk) as one bool mask that
        broadcasts to (B, n_heads, Tq, Tk), True = may attend; None when both are None."""
        allowed = None
        if key_padding_mask is not None:
            # a padded key is hidden from every query: the mask runs along the key axis, the last one.
            allowed = key_padding_mask[:, None, None, :]   # (B, 1, 1, Tk)
        if attn_mask is not None:
            mask = attn_mask if attn_mask.dim() == 2 else attn_mask[:, None]   # (Tq, Tk) or (B, 1, Tq, Tk)
            allowed = mask if allowed is None else allowed & mask
        return allowed

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """query (B, Tq, d_model), key (B, Tk, kdim), value (B, Tk, vdim) ->
        (out (B, Tq, d_model), weights (B, n_heads, Tq, Tk)). No mask by default: every query sees every key."""
        q = self.split_heads(self.q_proj(query))   # (B, H, Tq, hd)
        k = self.split_heads(self.k_proj(key))     # (B, H, Tk, hd)
        v = self.split_heads(self.v_proj(value))   # (B, H, Tk, hd)
        att = (q @ k.transpose(-2, -1)) * self.scale   # (B, H, Tq, Tk): one row per query, linear in Tk
        allowed = self.combine_masks(key_padding_mask, attn_mask)
        if allowed is not None:
            att = att.masked_fill(~allowed, float("-inf"))
        att = F.softmax(att, dim=-1)   # each query's row is a distribution over the keys
        y = att @ v   # (B, H, Tq, hd)
        return self.out_proj(self.merge_heads(y)), att   # (B, Tq, C), (B, H, Tq, Tk)
