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
        # four nn.Linear layers, with bias:
        # self.q_proj = nn.Linear(d_model, d_model)
        # self.k_proj = nn.Linear(kdim, d_model)
        # self.v_proj = nn.Linear(vdim, d_model)
        # self.out_proj = nn.Linear(d_model, d_model)
        raise NotImplementedError("write MultiHeadAttention.__init__")

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, T, d_model) -> (B, n_heads, T, head_dim): head h owns channels h*head_dim to (h+1)*head_dim."""
        raise NotImplementedError("write split_heads")

    def merge_heads(self, y: torch.Tensor) -> torch.Tensor:
        """(B, n_heads, T, head_dim) -> (B, T, d_model): the inverse of split_heads."""
        raise NotImplementedError("write merge_heads")

    def combine_masks(self, key_padding_mask: torch.Tensor | None,
                      attn_mask: torch.Tensor | None) -> torch.Tensor | None:
        """key_padding_mask (B, Tk) and attn_mask (Tq, Tk) or (B, Tq, Tk) as one bool mask that
        broadcasts to (B, n_heads, Tq, Tk), True = may attend; None when both are None."""
        raise NotImplementedError("write combine_masks")

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """query (B, Tq, d_model), key (B, Tk, kdim), value (B, Tk, vdim) ->
        (out (B, Tq, d_model), weights (B, n_heads, Tq, Tk)). No mask by default: every query sees every key."""
        raise NotImplementedError("write forward")
