"""fairseq's SinusoidalPositionalEmbedding forward: `make_positions(input, padding_idx)` numbers the
tokens from padding_idx + 1 (`torch.cumsum(mask, dim=1) * mask + padding_idx`, with fairseq's usual
padding_idx = 1), looked up in a table of padding_idx + 1 + T rows whose padding row is zeroed. The
table itself is brought to the kata's layout and exponent (interleaved, d/2), so the one mistake
left is the offset: row p is the encoding of position p + 2. The ALiBi functions are the paper's."""
import math

import torch


def get_embedding(num_embeddings, embedding_dim, padding_idx=None):
    half_dim = embedding_dim // 2
    emb = torch.exp(torch.arange(half_dim, dtype=torch.float) * -(math.log(10000) / half_dim))
    emb = torch.arange(num_embeddings, dtype=torch.float).unsqueeze(1) * emb.unsqueeze(0)
    emb = torch.stack([torch.sin(emb), torch.cos(emb)], dim=2).view(num_embeddings, -1)
    if padding_idx is not None:
        emb[padding_idx, :] = 0
    return emb


def make_positions(tensor, padding_idx):
    mask = tensor.ne(padding_idx).int()
    return (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + padding_idx


def sinusoidal(T, d, padding_idx=1):
    if d % 2:
        raise ValueError(f"d={d} must be even")
    weights = get_embedding(padding_idx + 1 + T, d, padding_idx)
    tokens = torch.full((1, T), padding_idx + 1)   # T tokens, none of them padding
    return weights.index_select(0, make_positions(tokens, padding_idx).view(-1))


def shift_matrix(k, d):
    if d % 2:
        raise ValueError(f"d={d} must be even")
    angle = k * torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * -(math.log(10000.0) / d))
    m = torch.zeros(d, d, dtype=torch.float64)
    m[0::2, 0::2] = torch.diag(angle.cos())
    m[0::2, 1::2] = torch.diag(angle.sin())
    m[1::2, 0::2] = torch.diag(-angle.sin())
    m[1::2, 1::2] = torch.diag(angle.cos())
    return m.float()


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
