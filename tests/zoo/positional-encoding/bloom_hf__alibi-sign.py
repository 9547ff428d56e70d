"""BLOOM's slopes with the relative position subtracted the wrong way round, query minus key:
+slope·(i - j), a bonus that grows with the distance instead of a penalty."""
import math

import numpy as np
import torch


def create_sinusoidal_embeddings(n_pos, dim, out):
    position_enc = np.array([[pos / np.power(10000, 2 * (j // 2) / dim) for j in range(dim)] for pos in range(n_pos)])
    out.requires_grad = False
    out[:, 0::2] = torch.FloatTensor(np.sin(position_enc[:, 0::2]))
    out[:, 1::2] = torch.FloatTensor(np.cos(position_enc[:, 1::2]))
    out.detach_()


def sinusoidal(T, d):
    if d % 2 != 0:
        raise ValueError(f"dim={d} must be even")
    out = torch.empty(T, d)
    create_sinusoidal_embeddings(T, d, out)
    return out


def shift_matrix(k, d):
    if d % 2 != 0:
        raise ValueError(f"dim={d} must be even")
    theta = torch.tensor([k / np.power(10000, 2 * i / d) for i in range(d // 2)])
    blocks = [torch.tensor([[math.cos(t), math.sin(t)], [-math.sin(t), math.cos(t)]]) for t in theta.tolist()]
    return torch.block_diag(*blocks)


def alibi_slopes(num_heads):
    closest_power_of_2 = 2 ** math.floor(math.log2(num_heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest_power_of_2) - 3))), dtype=torch.float32)
    powers = torch.arange(1, 1 + closest_power_of_2, dtype=torch.int32)
    slopes = torch.pow(base, powers)
    if closest_power_of_2 != num_heads:
        extra_base = torch.tensor(2 ** (-(2 ** -(math.log2(2 * closest_power_of_2) - 3))), dtype=torch.float32)
        num_remaining_heads = min(closest_power_of_2, num_heads - closest_power_of_2)
        extra_powers = torch.arange(1, 1 + 2 * num_remaining_heads, 2, dtype=torch.int32)
        slopes = torch.cat([slopes, torch.pow(extra_base, extra_powers)], dim=0)
    return slopes


def alibi_bias(num_heads, T):
    attention_mask = torch.ones(1, T)
    arange_tensor = ((attention_mask.cumsum(dim=-1) - 1) * attention_mask)[:, None, :]
    query_positions = arange_tensor.transpose(-1, -2)
    alibi = alibi_slopes(num_heads)[..., None, None] * (query_positions - arange_tensor)
    causal_mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    return alibi.masked_fill(causal_mask, float("-inf"))
