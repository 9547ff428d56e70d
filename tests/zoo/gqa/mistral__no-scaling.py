"""Mistral's idiom with `self.scale` computed in __init__ and never applied: the scores go from
`torch.matmul(query, key.transpose(2, 3))` to the mask and the softmax unscaled.
"""
import torch
import torch.nn.functional as F
from torch import nn


def repeat_kv(x, n_rep):
    return torch.repeat_interleave(x, repeats=n_rep, dim=1)


def repeat_kv_bshd(keys, values, repeats, dim):
    keys = torch.repeat_interleave(keys, repeats=repeats, dim=dim)
    values = torch.repeat_interleave(values, repeats=repeats, dim=dim)
    return keys, values


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(f"dim={d_model}, n_heads={n_heads}, n_kv_heads={n_kv_heads}: heads must divide evenly")
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = d_model // n_heads
        self.repeats = self.n_heads // self.n_kv_heads
        self.scale = self.head_dim ** -0.5
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=False)

    def forward(self, x, causal=True):
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        xq = xq.view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        key, value = repeat_kv_bshd(xk, xv, self.repeats, dim=2)

        query = xq.transpose(1, 2)
        key = key.transpose(1, 2)
        value = value.transpose(1, 2)
        scores = torch.matmul(query, key.transpose(2, 3))
        if causal:
            tensor = torch.full((seqlen, seqlen), dtype=x.dtype, fill_value=1, device=x.device)
            mask = torch.log(torch.tril(tensor, diagonal=0))
            scores += mask[None, None, ...]
        scores = F.softmax(scores.float(), dim=-1).type_as(query)
        output = torch.matmul(scores, value)  # (bs, n_local_heads, slen, head_dim)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.o_proj(output)
