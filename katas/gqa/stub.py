import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, n_kv_heads, T, head_dim) -> (B, n_kv_heads * n_rep, T, head_dim).

    Each KV head is repeated ``n_rep`` times in a row (``repeat_interleave``, not ``repeat``):
    output head ``j`` is input head ``j // n_rep``, so query heads ``g*n_rep .. (g+1)*n_rep - 1``
    share KV head ``g``.
    """
    raise NotImplementedError("write repeat_kv")


class GroupedQueryAttention(nn.Module):
    """Causal self-attention in which groups of ``n_heads // n_kv_heads`` query heads share one
    key/value head (Llama 3, Mistral, Llama 2 70B). ``n_kv_heads == n_heads`` is plain multi-head attention,
    ``n_kv_heads == 1`` is multi-query attention.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int):
        """Raises ValueError unless ``n_heads`` divides ``d_model`` and ``n_kv_heads`` divides ``n_heads``."""
        super().__init__()
        # head_dim = d_model // n_heads; all four projections with bias=False:
        # self.q_proj = nn.Linear(d_model, d_model)
        # self.k_proj = nn.Linear(d_model, n_kv_heads * head_dim)
        # self.v_proj = nn.Linear(d_model, n_kv_heads * head_dim)
        # self.o_proj = nn.Linear(d_model, d_model)
        raise NotImplementedError("write GroupedQueryAttention.__init__")

    def forward(self, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        """x (B, T, d_model) -> (B, T, d_model); with ``causal``, query i attends to keys 0..i."""
        raise NotImplementedError("write GroupedQueryAttention.forward")
