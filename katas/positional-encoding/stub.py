import math

import torch


def sinusoidal(T: int, d: int) -> torch.Tensor:
    """The ``(T, d)`` float32 table of "Attention Is All You Need" for positions ``0..T-1``.

    ``PE[p, 2i] = sin(p / 10000^(2i/d))`` and ``PE[p, 2i+1] = cos(p / 10000^(2i/d))``: sin and cos
    of the same frequency side by side. Raises ValueError when ``d`` is odd.
    """
    raise NotImplementedError("write sinusoidal")


def shift_matrix(k: int, d: int) -> torch.Tensor:
    """The ``(d, d)`` float32 matrix ``M_k`` with ``PE[p + k] == PE[p] @ M_k.T`` for every ``p``.

    Block-diagonal: each (sin, cos) pair of frequency omega_i is turned by the angle ``k * omega_i``.
    ``k`` may be negative. Raises ValueError when ``d`` is odd.
    """
    raise NotImplementedError("write shift_matrix")


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's ``(n_heads,)`` float32 slopes: ``2^(-8i/n_heads)`` for i = 1..n_heads when
    ``n_heads`` is a power of two. Otherwise, as the paper's code: the slopes of n, the largest
    power of two below ``n_heads``, then every other slope of 2n (``alibi_slopes(2n)[0::2]``) for
    the remaining ``n_heads - n`` heads.
    """
    raise NotImplementedError("write alibi_slopes")


def alibi_bias(n_heads: int, T: int) -> torch.Tensor:
    """The ``(n_heads, T, T)`` float32 bias added to the scaled scores of a causal self-attention.

    ``bias[h, i, j] = -slope_h * (i - j)`` for keys ``j <= i`` (0 on the diagonal, more negative
    the further back the key) and ``-inf`` above the diagonal: no query sees a later key.
    """
    raise NotImplementedError("write alibi_bias")
