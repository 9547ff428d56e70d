"""The table of "How to code The Transformer in PyTorch" as published: `(2 * i) / d` where i already
steps by 2 (so 4i/d for pair i), and `(2 * (i + 1)) / d` for the cos column, whose frequency is
then not the sin's."""
import math

import torch


def sinusoidal(T, d):
    if d % 2:
        raise ValueError(f"odd d_model {d}")
    pe = torch.zeros(T, d)
    for pos in range(T):
        for i in range(0, d, 2):
            pe[pos, i] = math.sin(pos / (10000 ** ((2 * i) / d)))
            pe[pos, i + 1] = math.cos(pos / (10000 ** ((2 * (i + 1)) / d)))
    return pe


def shift_matrix(k, d):
    if d % 2:
        raise ValueError(f"odd d_model {d}")
    m = torch.zeros(d, d)
    for i in range(0, d, 2):
        angle = k / (10000 ** (i / d))
        m[i, i], m[i, i + 1] = math.cos(angle), math.sin(angle)
        m[i + 1, i], m[i + 1, i + 1] = -math.sin(angle), math.cos(angle)
    return m


def gen_slopes(n_heads, alibi_bias_max=8):
    _n_heads = 2 ** math.ceil(math.log2(n_heads))
    m = torch.arange(1, _n_heads + 1, dtype=torch.float32)
    m = m.mul(alibi_bias_max / _n_heads)
    slopes = 1.0 / torch.pow(2, m)
    if _n_heads != n_heads:
        slopes = torch.concat([slopes[1::2], slopes[::2]])[:n_heads]
    return slopes


def alibi_slopes(n_heads):
    return gen_slopes(n_heads)


def build_alibi_bias(n_heads, seq_len, full=False, alibi_bias_max=8):
    alibi_bias = torch.arange(1 - seq_len, 1, dtype=torch.int32).view(1, 1, 1, seq_len)
    if full:
        alibi_bias = alibi_bias - torch.arange(1 - seq_len, 1, dtype=torch.int32).view(1, 1, seq_len, 1)
        alibi_bias = alibi_bias.abs().mul(-1)
    slopes = gen_slopes(n_heads, alibi_bias_max)
    alibi_bias = alibi_bias * slopes.view(1, n_heads, 1, 1)
    return alibi_bias


def alibi_bias(n_heads, T):
    bias = build_alibi_bias(n_heads, T, full=True)[0]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    return bias.masked_fill(~causal, float("-inf"))
