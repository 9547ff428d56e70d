"""The hand-rolled per-head loop, the shares summed on rank 0 only, as if rank 0 gathered the
result: the other ranks never call the all-reduce rank 0 waits in."""
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
        w, b = shard_qkv(state_dict["c_attn.weight"], state_dict["c_attn.bias"], n_heads, n_kv_heads, rank, world_size)
        self.hd = state_dict["c_proj.weight"].shape[0] // n_heads
        self.n_q = n_heads // world_size
        self.n_kv = max(n_kv_heads // world_size, 1)
        self.w_qkv = nn.Parameter(w.clone())
        self.b_qkv = nn.Parameter(b.clone())
        self.w_o = nn.Parameter(shard_out(state_dict["c_proj.weight"], rank, world_size).clone())
        self.b_o = nn.Parameter(state_dict["c_proj.bias"].clone())

    def forward(self, x):
        B, T, C = x.shape
        hd, n_q, n_kv = self.hd, self.n_q, self.n_kv
        qkv = x @ self.w_qkv.t() + self.b_qkv
        future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        out = torch.zeros(B, T, C, dtype=x.dtype)
        for h in range(n_q):
            g = h // (n_q // n_kv)
            q = qkv[:, :, h * hd:(h + 1) * hd]
            k = qkv[:, :, (n_q + g) * hd:(n_q + g + 1) * hd]
            v = qkv[:, :, (n_q + n_kv + g) * hd:(n_q + n_kv + g + 1) * hd]
            scores = q @ k.transpose(1, 2) / math.sqrt(hd)
            scores = scores.masked_fill(future, float("-inf"))
            weights = torch.softmax(scores, dim=-1)
            out = out + (weights @ v) @ self.w_o[:, h * hd:(h + 1) * hd].t()
        if dist.get_rank() == 0:
            dist.all_reduce(out)
        return out + self.b_o
