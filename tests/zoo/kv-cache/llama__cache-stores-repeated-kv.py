"""Meta's Llama idiom (meta-llama/llama, model.py), its preallocated (bsz, max_seq_len, heads,
head_dim) buffer sized at the first write, with repeat_kv moved before the cache write: the
buffer holds n_heads heads per token, the repeated copies, and the outputs are still right
(cache-stores-repeated-kv)."""
import math

import torch
import torch.nn.functional as F
from torch import nn


class KVCache:
    def __init__(self, max_seq_len=256):
        self.max_seq_len = max_seq_len
        self.cache_k = self.cache_v = None
        self.pos = 0

    def append(self, k, v):
        xk, xv = k.transpose(1, 2), v.transpose(1, 2)   # (bsz, seqlen, n_kv_heads, head_dim)
        bsz, seqlen, n_heads, head_dim = xk.shape
        if self.cache_k is None:
            self.cache_k = torch.zeros(bsz, self.max_seq_len, n_heads, head_dim, dtype=k.dtype, device=k.device)
            self.cache_v = torch.zeros(bsz, self.max_seq_len, n_heads, head_dim, dtype=v.dtype, device=v.device)
        end = self.pos + seqlen
        self.cache_k[:bsz, self.pos:end] = xk
        self.cache_v[:bsz, self.pos:end] = xv
        self.pos = end
        return self.cache_k[:bsz, :end].transpose(1, 2), self.cache_v[:bsz, :end].transpose(1, 2)

    def reset(self):
        self.pos = 0

    def __len__(self):
        return self.pos


def repeat_kv(x, n_rep):
    """torch.repeat_interleave(x, dim=2, repeats=n_rep) on (bs, seqlen, n_kv_heads, head_dim)."""
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return x[:, :, :, None, :].expand(bs, slen, n_kv_heads, n_rep, head_dim).reshape(bs, slen, n_kv_heads * n_rep, head_dim)


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        if d_model % n_heads != 0 or n_heads % n_kv_heads != 0:
            raise ValueError(f"dim {d_model}, n_heads {n_heads}, n_kv_heads {n_kv_heads}: heads must divide evenly")
        self.n_local_heads, self.n_local_kv_heads = n_heads, n_kv_heads
        self.n_rep = n_heads // n_kv_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=False)

    def forward(self, x, cache=None, start_pos=0):
        cached = len(cache) if cache is not None else 0
        if start_pos != cached:
            raise ValueError(f"start_pos={start_pos}, but the cache holds {cached} tokens")
        bsz, seqlen, _ = x.shape
        xq = self.q_proj(x).view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xk = self.k_proj(x).view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xv = self.v_proj(x).view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xk, xv = repeat_kv(xk, self.n_rep), repeat_kv(xv, self.n_rep)   # (bs, seqlen, n_heads, hd)
        if cache is not None:
            keys, values = cache.append(xk.transpose(1, 2), xv.transpose(1, 2))
            keys, values = keys.transpose(1, 2), values.transpose(1, 2)   # (bs, cache_len + seqlen, n_heads, hd)
        else:
            keys, values = xk, xv
        mask = None
        if seqlen > 1:
            mask = torch.full((seqlen, seqlen), float("-inf"), device=x.device)
            mask = torch.triu(mask, diagonal=1)
            mask = torch.hstack([torch.zeros((seqlen, start_pos), device=x.device), mask]).type_as(xq)
        xq, keys, values = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = torch.matmul(scores, values)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.o_proj(output)
