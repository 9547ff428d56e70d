"""Sinusoidal positional encodings, the rotation that shifts them, and ALiBi's attention bias.

Every tensor comes back in torch's default float32; positions are 0-based.
"""
import math

import torch


def _frequencies(d: int) -> torch.Tensor:
    """omega_i = 1 / 10000^(2i/d) for the d/2 (sin, cos) pairs, in float64."""
    if d % 2:
        raise ValueError(f"d ({d}) must be even: the encoding is made of (sin, cos) pairs")
    return 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)   # (d/2,)


def sinusoidal(T: int, d: int) -> torch.Tensor:
    """The ``(T, d)`` float32 table of "Attention Is All You Need" for positions ``0..T-1``.

    ``PE[p, 2i] = sin(p / 10000^(2i/d))`` and ``PE[p, 2i+1] = cos(p / 10000^(2i/d))``: sin and cos
    of the same frequency side by side. Raises ValueError when ``d`` is odd.
    """
    omega = _frequencies(d)   # (d/2,)
    # The phase p * omega reaches T - 1: float64 keeps it exact, so the table is rounded only once.
    angle = torch.arange(T, dtype=torch.float64)[:, None] * omega   # (T, d/2)
    pe = torch.stack([angle.sin(), angle.cos()], dim=-1)   # (T, d/2, 2): pair i is (sin, cos)
    return pe.reshape(T, d).float()   # (T, d), sin and cos interleaved


def shift_matrix(k: int, d: int) -> torch.Tensor:
    """The ``(d, d)`` float32 matrix ``M_k`` with ``PE[p + k] == PE[p] @ M_k.T`` for every ``p``.

    Block-diagonal: each (sin, cos) pair of frequency omega_i is turned by the angle ``k * omega_i``.
    ``k`` may be negative. Raises ValueError when ``d`` is odd.
    """
    omega = _frequencies(d)   # (d/2,)
    cos, sin = torch.cos(k * omega), torch.sin(k * omega)   # (d/2,) each
    # sin(a + b) = sin a cos b + cos a sin b and cos(a + b) = cos a cos b - sin a sin b: the new
    # pair is this 2x2 matrix times the old (sin, cos), whatever the position p.
    blocks = torch.stack([torch.stack([cos, sin], dim=-1), torch.stack([-sin, cos], dim=-1)], dim=-2)   # (d/2, 2, 2)
    return torch.block_diag(*blocks).float()   # (d, d)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's ``(n_heads,)`` float32 slopes: ``2^(-8i/n_heads)`` for i = 1..n_heads when
    ``n_heads`` is a power of two. Otherwise, as the paper's code: the slopes of n, the largest
    power of two below ``n_heads``, then every other slope of 2n (``alibi_slopes(2n)[0::2]``) for
    the remaining ``n_heads - n`` heads.
    """
    n = 2 ** int(math.log2(n_heads))   # the largest power of two <= n_heads
    slopes = 2.0 ** (-8.0 * torch.arange(1, n + 1) / n)   # (n,): 2^(-8/n) down to 2^-8
    if n < n_heads:
        # The odd-numbered slopes of 2n heads fall halfway (geometrically) between these.
        slopes = torch.cat([slopes, alibi_slopes(2 * n)[0::2][: n_heads - n]])   # (H,)
    return slopes   # (H,)


def alibi_bias(n_heads: int, T: int) -> torch.Tensor:
    """The ``(n_heads, T, T)`` float32 bias added to the scaled scores of a causal self-attention.

    ``bias[h, i, j] = -slope_h * (i - j)`` for keys ``j <= i`` (0 on the diagonal, more negative
    the further back the key) and ``-inf`` above the diagonal: no query sees a later key.
    """
    pos = torch.arange(T)   # (T,)
    relative = pos[None, :] - pos[:, None]   # (T, T): j - i, where key j sits relative to query i
    bias = alibi_slopes(n_heads)[:, None, None] * relative   # (H, T, T): -slope * (i - j)
    return bias.masked_fill(relative > 0, float("-inf"))   # (H, T, T): later keys hidden
