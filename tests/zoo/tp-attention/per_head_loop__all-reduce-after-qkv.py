"""The hand-rolled loop with the QKV projection split by its input (row-parallel) and all-reduced,
so every rank has every head's q, k and v and loops over all the heads with the whole W_o: the
right output, but one all-reduce of the projection and c_proj held whole on every rank."""
import math

import torch
import torch.distributed as dist
import torch.nn as nn


def shard_qkv(weight, bias, n_heads, n_kv_heads, rank, world_size):
    if n_heads % world_size or (n_kv_heads % world_size and world_size % n_kv_heads):
        raise ValueError("heads do not split evenly over the ranks")
    hd = weight.shape[0] // (n_heads + 2 * n_kv_heads)
    group = n_heads // n_kv_heads
    my_q = list(range(rank * n_heads // world_size, (rank + 1) * n_heads // world_size))
    my_kv = []
    for h in my_q:
        if h // group not in my_kv:
            my_kv.append(h // group)
    rows = []
    for h in my_q:
        rows += list(range(h * hd, (h + 1) * hd))
    for base in (n_heads * hd, (n_heads + n_kv_heads) * hd):
        for g in my_kv:
            rows += list(range(base + g * hd, base + (g + 1) * hd))
    return weight[rows], bias[rows]


def shard_out(weight, rank, world_size):
    width = weight.shape[1] // world_size
    return weight[:, rank * width:(rank + 1) * width]


class TensorParallelAttention(nn.Module):
    def __init__(self, state_dict, n_heads, n_kv_heads, rank, world_size):
        super().__init__()
        shard_qkv(state_dict["c_attn.weight"], state_dict["c_attn.bias"], n_heads, n_kv_heads, rank, world_size)
        w = state_dict["c_attn.weight"]
        C = w.shape[1]
        self.rank, self.width = rank, C // world_size
        self.hd, self.n_heads, self.n_kv_heads = C // n_heads, n_heads, n_kv_heads
        self.w_qkv = nn.Parameter(w[:, rank * self.width:(rank + 1) * self.width].clone())   # input columns
        self.b_qkv = nn.Parameter(state_dict["c_attn.bias"].clone())
        self.w_o = nn.Parameter(state_dict["c_proj.weight"].clone())
        self.b_o = nn.Parameter(state_dict["c_proj.bias"].clone())

    def forward(self, x):
        B, T, C = x.shape
        hd, H, Hkv = self.hd, self.n_heads, self.n_kv_heads
        qkv = x[:, :, self.rank * self.width:(self.rank + 1) * self.width] @ self.w_qkv.t()
        dist.all_reduce(qkv)
        qkv = qkv + self.b_qkv
        future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        out = torch.zeros(B, T, C, dtype=x.dtype)
        for h in range(H):
            g = h // (H // Hkv)
            q = qkv[:, :, h * hd:(h + 1) * hd]
            k = qkv[:, :, (H + g) * hd:(H + g + 1) * hd]
            v = qkv[:, :, (H + Hkv + g) * hd:(H + Hkv + g + 1) * hd]
            scores = q @ k.transpose(1, 2) / math.sqrt(hd)
            weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            out = out + (weights @ v) @ self.w_o[:, h * hd:(h + 1) * hd].t()
        return out + self.b_o
