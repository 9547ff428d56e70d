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
    B, Hkv, T, hd = x.shape
    # expand is a free view; the reshape then lays the n_rep copies of each head side by side.
    return x[:, :, None].expand(B, Hkv, n_rep, T, hd).reshape(B, Hkv * n_rep, T, hd)   # (B, H, T, hd)


class GroupedQueryAttention(nn.Module):
    """Causal self-attention in which groups of ``n_heads // n_kv_heads`` query heads share one
    key/value head (Llama 3, Mistral, Llama 2 70B). ``n_kv_heads == n_heads`` is plain multi-head attention,
    ``n_kv_heads == 1`` is multi-query attention.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int):
        """Raises ValueError unless ``n_heads`` divides ``d_model`` and ``n_kv_heads`` divides ``n_heads``."""
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads ({n_heads}) must be divisible by n_kv_heads ({n_kv_heads})")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.n_rep = n_heads // n_kv_heads   # query heads per KV head: the group size
        # each score sums head_dim products: 1/sqrt(head_dim) keeps it at unit variance.
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        # only n_kv_heads heads of keys and values: this is what shrinks the KV cache by n_rep.
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        """x (B, T, d_model) -> (B, T, d_model); with ``causal``, query i attends to keys 0..i."""
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)      # (B, H, T, hd)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)   # (B, Hkv, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)   # (B, Hkv, T, hd)
        k, v = repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep)   # (B, H, T, hd): query head j reads KV head j // n_rep
        att = (q @ k.transpose(-2, -1)) * self.scale   # (B, H, T, T)
        if causal:
            allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()   # (T, T), True = may attend
            att = att.masked_fill(~allowed, float("-inf"))
        att = F.softmax(att, dim=-1)   # each query's row is a distribution over the keys
        y = att @ v   # (B, H, T, hd)
        return self.o_proj(y.transpose(1, 2).contiguous().view(B, T, C))   # (B, T, C)
