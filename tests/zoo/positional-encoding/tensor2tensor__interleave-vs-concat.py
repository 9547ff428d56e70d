"""tensor2tensor's get_timing_signal_1d with its published layout: `tf.concat([tf.sin(scaled_time),
tf.cos(scaled_time)], axis=1)`, all the sines and then all the cosines, where the kata interleaves
the pairs. The increment is the paper's log(10000) / num_timescales (the published code divides by
num_timescales - 1; fairseq__interleave-vs-concat has both), so the layout is the one mistake."""
import math

import torch


def timescales(d, min_timescale=1.0, max_timescale=1.0e4):
    assert d % 2 == 0, f"d={d} must be even for (sin, cos) pairs"
    num_timescales = d // 2
    log_timescale_increment = math.log(float(max_timescale) / float(min_timescale)) / num_timescales
    return min_timescale * torch.exp(torch.arange(num_timescales, dtype=torch.float32) * -log_timescale_increment)


def sinusoidal(T, d):
    inv_timescales = timescales(d)
    position = torch.arange(T, dtype=torch.float32)
    scaled_time = position.unsqueeze(1) * inv_timescales.unsqueeze(0)
    return torch.cat([torch.sin(scaled_time), torch.cos(scaled_time)], dim=1)


def shift_matrix(k, d):
    angle = k * timescales(d)
    rows = torch.stack([torch.stack([angle.cos(), angle.sin()], 1), torch.stack([-angle.sin(), angle.cos()], 1)], 1)
    return torch.block_diag(*rows)


def alibi_slopes(n_heads):
    closest = 2 ** math.floor(math.log2(n_heads))
    base = torch.tensor(2 ** (-8 / closest), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, closest + 1, dtype=torch.float32))
    if closest != n_heads:
        extra_base = torch.tensor(2 ** (-4 / closest), dtype=torch.float32)
        extra = torch.pow(extra_base, torch.arange(1, 2 * (n_heads - closest), 2, dtype=torch.float32))
        slopes = torch.cat([slopes, extra])
    return slopes


def alibi_bias(n_heads, T):
    position = torch.arange(T, dtype=torch.float32)
    relative = position[None, :] - position[:, None]
    future = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
    return alibi_slopes(n_heads).view(-1, 1, 1) * relative + future
