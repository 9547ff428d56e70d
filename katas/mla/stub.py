"""Multi-head latent attention (MLA), as DeepSeek-V2 introduced it, with its compressed KV cache.

Each token's keys and values are compressed into one latent vector c_kv (kv_lora_rank numbers,
shared by every head) plus one small RoPE key k_rope (qk_rope_dim numbers, also shared by every
head): that pair is all the cache holds. The heads' keys and values are up-projected from c_kv
when needed, or never (the absorbed path: W_uk folded into the query, W_uv into the output).

Names and layouts follow DeepSeek's inference code (model.py): wq, wkv_a, wkv_b, wo. RoPE pairs
dimensions the way the rope kata does (and DeepSeek's model.py): pair i is ``(x[2i], x[2i+1])``,
turned by ``p * theta_i`` at position p, ``theta_i = 10000^(-2i/qk_rope_dim)``.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

ROPE_BASE = 10000.0


def mla_cache_bytes_per_token(kv_lora_rank: int, qk_rope_dim: int, n_layers: int = 1, dtype_bytes: int = 2) -> int:
    """Bytes the MLA cache takes per token: in every layer one latent c_kv and one RoPE key
    shared by all heads."""
    raise NotImplementedError("write mla_cache_bytes_per_token")


def kv_cache_bytes_per_token(n_kv_heads: int, head_dim: int, n_layers: int = 1, dtype_bytes: int = 2) -> int:
    """Bytes a KV cache takes per token: a key and a value of head_dim for each of n_kv_heads
    heads in every layer (multi-head attention: n_kv_heads = n_heads; GQA: fewer)."""
    raise NotImplementedError("write kv_cache_bytes_per_token")


def apply_rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x (B, T, dim) or (B, T, H, dim), token t at position ``positions[t]`` (``positions`` (T,)):
    each pair (x[2i], x[2i+1]) turned by ``positions[t] * theta_i``. A new tensor of x's dtype."""
    raise NotImplementedError("write apply_rope")


class MultiHeadLatentAttention(nn.Module):
    """Causal multi-head latent attention (DeepSeek-V2). Four bias-free projections:

    - ``wq``:    d_model -> n_heads * (qk_nope_dim + qk_rope_dim), each head's query [q_nope | q_rope]
    - ``wkv_a``: d_model -> kv_lora_rank + qk_rope_dim, the down-projection [c_kv | k_rope]
    - ``wkv_b``: kv_lora_rank -> n_heads * (qk_nope_dim + v_dim), each head's [W_uk; W_uv] rows
    - ``wo``:    n_heads * v_dim -> d_model

    ``forward(x, cache, absorb)`` returns ``(out, (c_kv, k_rope))``: out (B, T, d_model) and the
    cache of every token so far, c_kv (B, t, kv_lora_rank) and k_rope (B, t, qk_rope_dim), the
    RoPE key already rotated.
    """

    def __init__(self, d_model: int, n_heads: int, kv_lora_rank: int, qk_nope_dim: int, qk_rope_dim: int,
                 v_dim: int):
        """qk_rope_dim must be even: RoPE turns pairs of dimensions."""
        super().__init__()
        # Four nn.Linear(..., bias=False):
        # self.wq    d_model -> n_heads * (qk_nope_dim + qk_rope_dim)
        # self.wkv_a d_model -> kv_lora_rank + qk_rope_dim
        # self.wkv_b kv_lora_rank -> n_heads * (qk_nope_dim + v_dim)
        # self.wo    n_heads * v_dim -> d_model
        raise NotImplementedError("write MultiHeadLatentAttention.__init__")

    def forward(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None = None,
                absorb: bool = False) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x (B, T, d_model), its tokens at positions past .. past + T - 1 where past is the length of
        ``cache`` (0 without one) -> (out (B, T, d_model), (c_kv, k_rope)), c_kv (B, past + T,
        kv_lora_rank) and k_rope (B, past + T, qk_rope_dim). Causal: query i sees keys 0 .. past + i.

        absorb=False up-projects the cached latents into every head's keys and values; absorb=True
        computes the same attention in the latent space, never up-projecting the cache."""
        raise NotImplementedError("write MultiHeadLatentAttention.forward")
