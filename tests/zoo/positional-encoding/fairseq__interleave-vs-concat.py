"""fairseq's SinusoidalPositionalEmbedding.get_embedding as published (fairseq/modules/
sinusoidal_positional_embedding.py): `emb = math.log(10000) / (half_dim - 1)`, `torch.exp(torch.arange(
half_dim) * -emb)`, then `torch.cat([torch.sin(emb), torch.cos(emb)], dim=1)`: all the sines, then all
the cosines, with fairseq's d/2 - 1 in the exponent as well. No padding_idx here, so row p is
position p. The shift matrix is the kata's interleaved one; the ALiBi functions are the paper's."""
import math

import torch


def get_embedding(num_embeddings, embedding_dim, padding_idx=None):
    half_dim = embedding_dim // 2
    emb = math.log(10000) / (half_dim - 1)
    emb = torch.exp(torch.arange(half_dim, dtype=torch.float) * -emb)
    emb = torch.arange(num_embeddings, dtype=torch.float).unsqueeze(1) * emb.unsqueeze(0)
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=1).view(num_embeddings, -1)
    if embedding_dim % 2 == 1:
        # zero pad
        emb = torch.cat([emb, torch.zeros(num_embeddings, 1)], dim=1)
    if padding_idx is not None:
        emb[padding_idx, :] = 0
    return emb


def sinusoidal(T, d):
    if d % 2:
        raise ValueError(f"d={d} must be even")
    return get_embedding(T, d)


def shift_matrix(k, d):
    if d % 2:
        raise ValueError(f"d={d} must be even")
    omega = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * -(math.log(10000.0) / d))
    blocks = [torch.tensor([[math.cos(k * w), math.sin(k * w)], [-math.sin(k * w), math.cos(k * w)]]) for w in omega]
    return torch.block_diag(*blocks).float()


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
