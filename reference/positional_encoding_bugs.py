"""Known positional-encoding bugs, each a complete function with exactly that mistake."""
import math

import torch

from reference.positional_encoding import _frequencies, alibi_slopes


def _table(first, second, T):
    return torch.stack([first, second], dim=-1).reshape(T, -1).float()   # pairs side by side


def _rotations(omega, k, *, transposed=False):
    cos, sin = torch.cos(k * omega), torch.sin(k * omega)
    rows = [torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)] if transposed else \
        [torch.stack([cos, sin], -1), torch.stack([-sin, cos], -1)]
    return torch.block_diag(*torch.stack(rows, dim=-2)).float()


def _positions(T):
    return torch.arange(T, dtype=torch.float64)[:, None]


def sinusoidal_cos_first(T, d):
    angle = _positions(T) * _frequencies(d)
    return _table(angle.cos(), angle.sin(), T)   # cos in the even columns, sin in the odd ones


def _pair_index_over_d(d):
    if d % 2:
        raise ValueError(f"d ({d}) must be even")
    return 10000.0 ** (-torch.arange(d // 2, dtype=torch.float64) / d)   # i/d: the 2 forgotten


def sinusoidal_i_over_d(T, d):
    angle = _positions(T) * _pair_index_over_d(d)
    return _table(angle.sin(), angle.cos(), T)


def shift_matrix_i_over_d(k, d):
    return _rotations(_pair_index_over_d(d), k)


def sinusoidal_column_index(T, d):
    if d % 2:
        raise ValueError(f"d ({d}) must be even")
    angle = _positions(T) / 10000.0 ** (torch.arange(d, dtype=torch.float64) / d)   # j/d: cos columns one step off
    return torch.where(torch.arange(d) % 2 == 0, angle.sin(), angle.cos()).float()


def sinusoidal_exponent_doubled(T, d):
    if d % 2:
        raise ValueError(f"d ({d}) must be even")
    column = torch.arange(0, d, 2, dtype=torch.float64)   # the column index 2i, doubled again below
    sin = (_positions(T) / 10000.0 ** (2 * column / d)).sin()
    cos = (_positions(T) / 10000.0 ** (2 * (column + 1) / d)).cos()   # and the next column's for cos
    return _table(sin, cos, T)


def _fairseq_frequencies(d):
    if d % 2:
        raise ValueError(f"d ({d}) must be even")
    half = d // 2
    return torch.exp(torch.arange(half, dtype=torch.float64) * -(math.log(10000.0) / (half - 1)))   # half - 1, not half


def sinusoidal_half_minus_one(T, d):
    angle = _positions(T) * _fairseq_frequencies(d)
    return _table(angle.sin(), angle.cos(), T)


def shift_matrix_half_minus_one(k, d):
    return _rotations(_fairseq_frequencies(d), k)


def sinusoidal_concat(T, d):
    angle = _positions(T) * _frequencies(d)
    return torch.cat([angle.sin(), angle.cos()], dim=-1).float()   # all sines, then all cosines


def shift_matrix_concat(k, d):
    half = d // 2
    m = _rotations(_frequencies(d), k)
    order = [2 * i for i in range(half)] + [2 * i + 1 for i in range(half)]
    return m[order][:, order]   # the same rotations, for the concatenated layout


def sinusoidal_fairseq(T, d):
    angle = _positions(T) * _fairseq_frequencies(d)
    return torch.cat([angle.sin(), angle.cos()], dim=-1).float()   # fairseq's get_embedding: halves, as published


def sinusoidal_from_one(T, d):
    angle = (_positions(T) + 1) * _frequencies(d)   # positions 1..T: counted from 1
    return _table(angle.sin(), angle.cos(), T)


def sinusoidal_after_padding(T, d, padding_idx=1):
    angle = (_positions(T) + padding_idx + 1) * _frequencies(d)   # fairseq's make_positions: from padding_idx + 1
    return _table(angle.sin(), angle.cos(), T)


def shift_matrix_transposed(k, d):
    return _rotations(_frequencies(d), k, transposed=True)   # the textbook rotation, for (cos, sin) pairs


def alibi_slopes_power_of_two_only(n_heads):
    return 2.0 ** (-8.0 * torch.arange(1, n_heads + 1) / n_heads)   # right only when n_heads is a power of two


def _masked(bias, T):
    pos = torch.arange(T)
    return bias.masked_fill(pos[None, :] > pos[:, None], float("-inf"))


def alibi_bias_power_of_two_only(n_heads, T):
    pos = torch.arange(T)
    return _masked(alibi_slopes_power_of_two_only(n_heads)[:, None, None] * (pos[None, :] - pos[:, None]), T)


def alibi_bias_positive(n_heads, T):
    pos = torch.arange(T)
    return _masked(alibi_slopes(n_heads)[:, None, None] * (pos[:, None] - pos[None, :]), T)   # +slope * (i - j)


def alibi_bias_key_position(n_heads, T):
    pos = torch.arange(T)
    return _masked(alibi_slopes(n_heads)[:, None, None] * pos.expand(T, T), T)   # BLOOM: slope * j


def alibi_bias_from_last(n_heads, T):
    pos = torch.arange(1 - T, 1)
    return _masked(alibi_slopes(n_heads)[:, None, None] * pos.expand(T, T), T)   # MPT: slope * (j - (T - 1))


def alibi_bias_symmetric(n_heads, T):
    pos = torch.arange(T)
    return -alibi_slopes(n_heads)[:, None, None] * (pos[:, None] - pos[None, :]).abs()   # -slope * |i - j|, no mask


def alibi_bias_unmasked(n_heads, T):
    pos = torch.arange(T)
    return alibi_slopes(n_heads)[:, None, None] * (pos[None, :] - pos[:, None])   # later keys not hidden


BUGS = {
    "sin-cos-swapped": {"sinusoidal": sinusoidal_cos_first},
    "frequency-exponent": [{"sinusoidal": sinusoidal_i_over_d, "shift_matrix": shift_matrix_i_over_d},
                           {"sinusoidal": sinusoidal_column_index},
                           {"sinusoidal": sinusoidal_half_minus_one, "shift_matrix": shift_matrix_half_minus_one},
                           {"sinusoidal": sinusoidal_exponent_doubled}],
    "interleave-vs-concat": [{"sinusoidal": sinusoidal_concat},
                             {"sinusoidal": sinusoidal_concat, "shift_matrix": shift_matrix_concat},
                             {"sinusoidal": sinusoidal_fairseq}],
    "position-off-by-one": {"sinusoidal": sinusoidal_from_one},
    "position-offset": {"sinusoidal": sinusoidal_after_padding},
    "shift-matrix-transposed": {"shift_matrix": shift_matrix_transposed},
    "alibi-slope-power-of-two-only": {"alibi_slopes": alibi_slopes_power_of_two_only,
                                      "alibi_bias": alibi_bias_power_of_two_only},
    "alibi-sign": {"alibi_bias": alibi_bias_positive},
    "alibi-absolute-positions": [{"alibi_bias": alibi_bias_key_position}, {"alibi_bias": alibi_bias_from_last}],
    "alibi-not-causal": [{"alibi_bias": alibi_bias_symmetric}, {"alibi_bias": alibi_bias_unmasked}],
}
