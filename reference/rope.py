"""Rotary position embeddings (RoPE) and a causal attention that uses them.

This kata pairs dimensions the way the RoFormer paper and Meta's original Llama code do: pair i is
``(x[2i], x[2i+1])``, turned by the angle ``p * theta_i`` at position p, ``theta_i = base^(-2i/head_dim)``.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def _frequencies(head_dim: int, base: float) -> torch.Tensor:
    """theta_i = base^(-2i/head_dim) for the head_dim/2 pairs, in float64."""
    if head_dim % 2:
        raise ValueError(f"head_dim ({head_dim}) must be even: RoPE turns pairs of dimensions")
    return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)   # (hd/2,)


def rope_cache(T: int, head_dim: int, base: float = 10000.0,
               dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each ``(T, head_dim // 2)`` of ``dtype``: ``cos[p, i] = cos(p * theta_i)``
    and ``sin[p, i] = sin(p * theta_i)`` for positions ``0..T-1``, ``theta_i = base^(-2i/head_dim)``.

    Row p holds the angles of position p; column i is the pair ``(x[2i], x[2i+1])``.
    Raises ValueError when ``head_dim`` is odd.
    """
    theta = _frequencies(head_dim, base)   # (hd/2,)
    # The angle p * theta reaches T - 1 radians: float64 keeps it exact, so each entry is rounded once.
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta   # (T, hd/2)
    return angle.cos().to(dtype), angle.sin().to(dtype)   # (T, hd/2) each


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``x`` ``(B, H, T, head_dim)`` with token t at absolute position ``positions[t]`` (``positions``
    ``(T,)`` integers, rows of ``cos`` and ``sin``), each pair ``(x[2i], x[2i+1])`` turned by the
    angle ``positions[t] * theta_i``. Returns a new tensor of ``x``'s shape and dtype; ``x`` is unchanged.
    """
    c, s = cos[positions], sin[positions]   # (T, hd/2) each: the angles of each token's own position
    x0, x1 = x[..., 0::2], x[..., 1::2]   # (B, H, T, hd/2) each: the two halves of every pair
    # The 2x2 rotation [[cos, -sin], [sin, cos]] applied to every (x0, x1) pair.
    out = torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1)   # (B, H, T, hd/2, 2)
    return out.flatten(-2).to(x.dtype)   # (B, H, T, hd), pairs back in place


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
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        # each score sums head_dim products: 1/sqrt(head_dim) keeps it at unit variance.
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        # Buffers follow .to(device, dtype); float64 here, so a float64 module is exact and a float32
        # one rounds each entry once. Not persistent: they are recomputed, never learned or saved.
        cos, sin = rope_cache(max_len, self.head_dim, base, dtype=torch.float64)   # (max_len, hd/2) each
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor, past_kv: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x ``(B, T, d_model)``, its tokens at positions ``past .. past + T - 1`` where ``past`` is the
        length of ``past_kv`` (0 without it) -> ``(out (B, T, d_model), (k, v))``, k and v
        ``(B, n_heads, past + T, head_dim)``. Causal: query i attends to keys ``0 .. past + i``."""
        B, T, C = x.shape
        past = 0 if past_kv is None else past_kv[0].shape[2]
        positions = torch.arange(past, past + T, device=x.device)   # (T,): where x's tokens sit
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)   # (B, H, T, hd)
        k = self.k_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)   # (B, H, T, hd)
        v = self.v_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)   # (B, H, T, hd)
        q = apply_rope(q, self.cos, self.sin, positions)   # (B, H, T, hd)
        # only q and k: their dot product then depends on m - n alone; v carries content, not position.
        k = apply_rope(k, self.cos, self.sin, positions)   # (B, H, T, hd)
        if past_kv is not None:
            # cached keys were rotated at their own positions already: rotating is done once per token.
            k = torch.cat([past_kv[0], k], dim=2)   # (B, H, past + T, hd)
            v = torch.cat([past_kv[1], v], dim=2)   # (B, H, past + T, hd)
        att = (q @ k.transpose(-2, -1)) * self.scale   # (B, H, T, past + T)
        # query i sits at past + i: bottom-right aligned, it sees keys 0 .. past + i.
        allowed = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(past)   # (T, past + T)
        att = att.masked_fill(~allowed, float("-inf"))
        att = F.softmax(att, dim=-1)   # each query's row is a distribution over the keys
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)   # (B, T, C)
        return self.o_proj(y), (k, v)   # (B, T, C), (B, H, past + T, hd) each
