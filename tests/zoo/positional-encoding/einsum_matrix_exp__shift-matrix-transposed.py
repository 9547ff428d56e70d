"""The matrix exponential with the textbook generator [[0, -ω], [ω, 0]], which turns (x, y) =
(cos, sin) pairs forward: the kata's pairs are (sin, cos), so this M_k is the transpose of the right
one and shifts the table by -k."""
import math

import torch


def inverse_frequencies(d):
    if d % 2 != 0:
        raise ValueError(f"head dimension {d} must be even")
    return 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))


def sinusoidal(T, d):
    freqs = torch.einsum("p,i->pi", torch.arange(T, dtype=torch.float32), inverse_frequencies(d))
    return torch.stack((freqs.sin(), freqs.cos()), dim=-1).flatten(-2)


def shift_matrix(k, d):
    omega = inverse_frequencies(d).double()
    generator = torch.zeros(d, d, dtype=torch.float64)
    generator[0::2, 1::2] = -torch.diag(omega)
    generator[1::2, 0::2] = torch.diag(omega)
    return torch.linalg.matrix_exp(k * generator).float()


def alibi_slopes(n_heads):
    n = 2 ** int(math.log2(n_heads))
    exponents = torch.arange(1, n + 1, dtype=torch.float32) * 8 / n
    if n < n_heads:
        exponents = torch.cat([exponents, torch.arange(1, 2 * (n_heads - n), 2, dtype=torch.float32) * 4 / n])
    return torch.exp2(-exponents)


def alibi_bias(n_heads, T):
    position = torch.arange(T, dtype=torch.float32)
    relative = position.view(1, T) - position.view(T, 1)
    bias = torch.einsum("h,ij->hij", alibi_slopes(n_heads), relative)
    return bias.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
