"""The TensorFlow tutorial's get_angles 'simplified': `np.power(10000, i / d)` with i the column
index. The sin columns (i = 2j) keep their frequency, but each cos column takes the next pair's, so
sin and cos of a pair no longer share one; the shift matrix, built from even i only, is right."""
import numpy as np
import torch


def get_angles(pos, i, d_model):
    angle_rates = 1 / np.power(10000, i / np.float64(d_model))
    return pos * angle_rates


def sinusoidal(T, d):
    if d % 2:
        raise ValueError(f"d_model must be even, got {d}")
    angle_rads = get_angles(np.arange(T)[:, np.newaxis], np.arange(d)[np.newaxis, :], d)
    angle_rads[:, 0::2] = np.sin(angle_rads[:, 0::2])
    angle_rads[:, 1::2] = np.cos(angle_rads[:, 1::2])
    return torch.from_numpy(angle_rads).float()


def shift_matrix(k, d):
    if d % 2:
        raise ValueError(f"d_model must be even, got {d}")
    rates = get_angles(1, np.arange(0, d, 2), d)
    m = np.zeros((d, d))
    idx = np.arange(0, d, 2)
    m[idx, idx] = np.cos(k * rates)
    m[idx, idx + 1] = np.sin(k * rates)
    m[idx + 1, idx] = -np.sin(k * rates)
    m[idx + 1, idx + 1] = np.cos(k * rates)
    return torch.from_numpy(m).float()


def alibi_slopes(n_heads):
    n = 2 ** int(np.floor(np.log2(n_heads)))
    slopes = 2.0 ** (-8.0 * np.arange(1, n + 1) / n)
    extra = 2.0 ** (-8.0 * np.arange(1, 2 * n, 2) / (2 * n))
    return torch.from_numpy(np.concatenate([slopes, extra[: n_heads - n]])).float()


def alibi_bias(n_heads, T):
    i, j = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    bias = -alibi_slopes(n_heads).numpy().astype(np.float64)[:, None, None] * (i - j)
    bias = np.where(j > i, -np.inf, bias)
    return torch.from_numpy(bias).float()
