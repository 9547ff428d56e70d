"""The einsum version, the all-reduced partial outputs then divided by world_size: the mean of
the shares where their sum is the output."""
import math

import torch
import torch.distributed as dist
import torch.nn as nn


def shard_qkv(weight, bias, n_heads, n_kv_heads, rank, world_size):
    if n_heads % world_size != 0 or (n_kv_heads % world_size != 0 and world_size % n_kv_heads != 0):
        raise ValueError(f"{n_heads} heads / {n_kv_heads} KV heads do not split over {world_size} ranks")
    hd = weight.shape[0] // (n_heads + 2 * n_kv_heads)
    w = weight.view(n_heads + 2 * n_kv_heads, hd, -1)   # (all heads, hd, C)
    b = bias.view(n_heads + 2 * n_kv_heads, hd)
    hq, hkv = n_heads // world_size, max(n_kv_heads // world_size, 1)
    g0 = rank * hq // (n_heads // n_kv_heads)
    idx = torch.cat([torch.arange(rank * hq, (rank + 1) * hq),
                     n_heads + torch.arange(g0, g0 + hkv),
                     n_heads + n_kv_heads + torch.arange(g0, g0 + hkv)])
    return w[idx].reshape(-1, weight.shape[1]), b[idx].reshape(-1)


def shard_out(weight, rank, world_size):
    return weight.tensor_split(world_size, dim=1)[rank].clone()


class TensorParallelAttention(nn.Module):
    def __init__(self, state_dict, n_heads, n_kv_heads, rank, world_size):
        super().__init__()
        w, b = shard_qkv(state_dict["c_attn.weight"], state_dict["c_attn.bias"], n_heads, n_kv_heads, rank, world_size)
        C = w.shape[1]
        hd = C // n_heads
        hq, hkv = n_heads // world_size, max(n_kv_heads // world_size, 1)
        w, b = w.view(-1, hd, C), b.view(-1, hd)
        self.wq, self.wk, self.wv = (nn.Parameter(t.clone()) for t in w.split([hq, hkv, hkv]))   # (h, hd, C)
        self.bq, self.bk, self.bv = (nn.Parameter(t.clone()) for t in b.split([hq, hkv, hkv]))   # (h, hd)
        self.wo = nn.Parameter(shard_out(state_dict["c_proj.weight"], rank, world_size).view(C, hq, hd))
        self.bo = nn.Parameter(state_dict["c_proj.bias"].clone())

    def forward(self, x):
        T = x.shape[1]
        hq, hkv, hd = self.wq.shape[0], self.wk.shape[0], self.wq.shape[1]
        q = torch.einsum("btc,hdc->bhtd", x, self.wq) + self.bq[:, None]
        k = torch.einsum("btc,gdc->bgtd", x, self.wk) + self.bk[:, None]
        v = torch.einsum("btc,gdc->bgtd", x, self.wv) + self.bv[:, None]
        q = q.unflatten(1, (hkv, hq // hkv))   # (b, g, r, t, d): the query heads of each KV head
        s = torch.einsum("bgrtd,bgsd->bgrts", q, k) / math.sqrt(hd)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).tril().logical_not(), float("-inf"))
        y = torch.einsum("bgrts,bgsd->bgrtd", s.softmax(-1), v).flatten(1, 2)   # (b, h, t, d)
        out = torch.einsum("bhtd,chd->btc", y, self.wo)
        dist.all_reduce(out)
        out = out / dist.get_world_size()   # the mean over the ranks
        return out + self.bo
