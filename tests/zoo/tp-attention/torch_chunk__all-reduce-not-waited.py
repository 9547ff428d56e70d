"""The torch.chunk version with the all-reduce made async to overlap it with nothing, and its
work handle never waited on."""
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def shard_qkv(weight, bias, n_heads, n_kv_heads, rank, world_size):
    if n_heads % world_size or (n_kv_heads % world_size and world_size % n_kv_heads):
        raise ValueError(f"can't shard {n_heads} heads, {n_kv_heads} KV heads over {world_size} ranks")
    hd = weight.size(0) // (n_heads + 2 * n_kv_heads)
    sizes = [n_heads * hd, n_kv_heads * hd, n_kv_heads * hd]
    shards = []
    for t in (weight, bias):
        q, k, v = torch.split(t, sizes, dim=0)
        if n_kv_heads >= world_size:
            k, v = k.chunk(world_size)[rank], v.chunk(world_size)[rank]
        else:
            replicas = world_size // n_kv_heads
            k, v = k.chunk(n_kv_heads)[rank // replicas], v.chunk(n_kv_heads)[rank // replicas]
        shards.append(torch.cat([q.chunk(world_size)[rank], k, v]))
    return shards[0], shards[1]


def shard_out(weight, rank, world_size):
    return torch.chunk(weight, world_size, dim=1)[rank].contiguous()


class TensorParallelAttention(nn.Module):
    def __init__(self, state_dict, n_heads, n_kv_heads, rank, world_size):
        super().__init__()
        w, b = shard_qkv(state_dict["c_attn.weight"], state_dict["c_attn.bias"], n_heads, n_kv_heads, rank, world_size)
        d_model = w.size(1)
        self.head_dim = d_model // n_heads
        self.n_local_heads = n_heads // world_size
        self.n_local_kv_heads = max(n_kv_heads // world_size, 1)
        self.c_attn = nn.Linear(d_model, w.size(0), dtype=w.dtype)
        self.c_proj = nn.Linear(d_model // world_size, d_model, dtype=w.dtype)
        self.c_attn.load_state_dict({"weight": w, "bias": b})
        self.c_proj.load_state_dict({"weight": shard_out(state_dict["c_proj.weight"], rank, world_size),
                                     "bias": state_dict["c_proj.bias"]})

    def forward(self, x):
        B, T, C = x.size()
        hd = self.head_dim
        q, k, v = self.c_attn(x).split([self.n_local_heads * hd, self.n_local_kv_heads * hd,
                                        self.n_local_kv_heads * hd], dim=2)
        q = q.view(B, T, self.n_local_heads, hd).transpose(1, 2)
        k = k.view(B, T, self.n_local_kv_heads, hd).transpose(1, 2)
        v = v.view(B, T, self.n_local_kv_heads, hd).transpose(1, 2)
        rep = self.n_local_heads // self.n_local_kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(torch.tril(torch.ones(T, T, dtype=torch.bool)) == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(B, T, self.n_local_heads * hd)
        out = F.linear(y, self.c_proj.weight)
        handle = dist.all_reduce(out, async_op=True)
        return out + self.c_proj.bias
