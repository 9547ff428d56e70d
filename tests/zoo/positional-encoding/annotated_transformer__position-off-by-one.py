"""The Annotated Transformer's PositionalEncoding with the positions counted from 1,
`position = torch.arange(1, T + 1)`: row p is the encoding of position p + 1, and row 0 is no
longer (0, 1, 0, 1, ...). The shift matrix and ALiBi are the Annotated Transformer zoo file's."""
import math

import torch


def sinusoidal(T, d):
    if d % 2 != 0:
        raise ValueError(f"Cannot use sin/cos positional encoding with odd dim (got dim={d})")
    pe = torch.zeros(T, d)
    position = torch.arange(1, T + 1).unsqueeze(1)   # counted from 1
    div_term = torch.exp(torch.arange(0, d, 2) * -(math.log(10000.0) / d))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


def shift_matrix(k, d):
    if d % 2 != 0:
        raise ValueError(f"Cannot use sin/cos positional encoding with odd dim (got dim={d})")
    div_term = torch.exp(torch.arange(0, d, 2) * -(math.log(10000.0) / d))
    m = torch.zeros(d, d)
    for i, w in enumerate(div_term):
        c, s = torch.cos(k * w), torch.sin(k * w)
        m[2 * i, 2 * i], m[2 * i, 2 * i + 1] = c, s
        m[2 * i + 1, 2 * i], m[2 * i + 1, 2 * i + 1] = -s, c
    return m


def get_slopes(n):
    def get_slopes_power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        ratio = start
        return [start * ratio ** i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return get_slopes_power_of_2(closest_power_of_2) + get_slopes(2 * closest_power_of_2)[0::2][:n - closest_power_of_2]


def alibi_slopes(n_heads):
    return torch.tensor(get_slopes(n_heads))


def alibi_bias(n_heads, T):
    context = torch.arange(T)[:, None]
    memory = torch.arange(T)[None, :]
    distance = memory - context
    bias = alibi_slopes(n_heads)[:, None, None] * distance
    return bias.masked_fill(distance > 0, float("-inf"))
