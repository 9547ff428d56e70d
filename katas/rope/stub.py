"""Rotary position embeddings (RoPE) and a causal attention that uses them.

This kata pairs dimensions the way the RoFormer paper and Meta's original Llama code do: pair i is
``(x[2i], x[2i+1])``, turned by the angle ``p * theta_i`` at position p, ``theta_i = base^(-2i/head_dim)``.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def rope_cache(T: int, head_dim: int, base: float = 10000.0,
               dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each ``(T, head_dim // 2)`` of ``dtype``: ``cos[p, i] = cos(p * theta_i)``
    and ``sin[p, i] = sin(p * theta_i)`` for positions ``0..T-1``, ``theta_i = base^(-2i/head_dim)``.

    Row p holds the angles of position p; column i is the pair ``(x[2i], x[2i+1])``.
    Raises ValueError when ``head_dim`` is odd.
    """
    raise NotImplementedError("write rope_cache")


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``x`` ``(B, H, T, head_dim)`` with token t at absolute position ``positions[t]`` (``positions``
    ``(T,)`` integers, rows of ``cos`` and ``sin``), each pair ``(x[2i], x[2i+1])`` turned by the
    angle ``positions[t] * theta_i``. Returns a new tensor of ``x``'s shape and dtype; ``x`` is unchanged.
    """
    raise NotImplementedError("write apply_rope")


class RoPEAttention(nn.Module):
    """Causal multi-head self-attention with rotary position embeddings, as in Llama: q and k are
    rotated by their positions after the head split, v is not. Four bias-free projections
    (q_proj, k_proj, v_proj, o_proj), no trainable parameter for positions.

    ``forward(x, past_kv)`` returns ``(out, (k, v))``: out ``(B, T, d_model)`` and the keys (already
    rotated) and values of every position so far, ``(B, n_heads, past + T, head_dim)`` each, to pass
    back as ``past_kv`` with the next tokens.
    """

    def __init__(self, d_model: int, n_heads: int, max_len: int = 2048, base: float = 10000.0):
        """Raises ValueError unless ``n_heads`` divides ``d_model`` into an even ``head_dim``.
        Positions ``0..max_len-1`` are supported."""
        super().__init__()
        # head_dim = d_model // n_heads; all four projections nn.Linear(d_model, d_model, bias=False):
        # self.q_proj, self.k_proj, self.v_proj, self.o_proj
        # cos, sin = rope_cache(max_len, head_dim, base), kept with register_buffer(..., persistent=False)
        raise NotImplementedError("write RoPEAttention.__init__")

    def forward(self, x: torch.Tensor, past_kv: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x ``(B, T, d_model)``, its tokens at positions ``past .. past + T - 1`` where ``past`` is the
        length of ``past_kv`` (0 without it) -> ``(out (B, T, d_model), (k, v))``, k and v
        ``(B, n_heads, past + T, head_dim)``. Causal: query i attends to keys ``0 .. past + i``."""
        raise NotImplementedError("write RoPEAttention.forward")
