"""Llama's idiom with the queries pre-scaled by 1/sqrt(head_dim), as some kernels take them, and the
scores still divided by sqrt(head_dim): the scores come out divided by head_dim.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn


def _repeat_kv_bshd(x, n_rep):
    """torch.repeat_interleave(x, dim=2, repeats=n_rep) on (bs, seqlen, n_kv_heads, head_dim)."""
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return (
        x[:, :, :, None, :]
        .expand(bs, slen, n_kv_heads, n_rep, head_dim)
        .reshape(bs, slen, n_kv_heads * n_rep, head_dim)
    )


def repeat_kv(x, n_rep):
    return _repeat_kv_bshd(x.transpose(1, 2), n_rep).transpose(1, 2)


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        assert d_model % n_heads == 0, f"dim {d_model} is not divisible by n_heads {n_heads}"
        assert n_heads % n_kv_heads == 0, f"n_heads {n_heads} is not divisible by n_kv_heads {n_kv_heads}"
        self.n_local_heads = n_heads
        self.n_local_kv_heads = n_kv_heads
        self.n_rep = self.n_local_heads // self.n_local_kv_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=False)

    def forward(self, x, causal=True):
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        xq = xq.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)

        keys = _repeat_kv_bshd(xk, self.n_rep)  # (bs, seqlen, n_local_heads, head_dim)
        values = _repeat_kv_bshd(xv, self.n_rep)

        xq = xq.transpose(1, 2) / math.sqrt(self.head_dim)  # (bs, n_local_heads, seqlen, head_dim), pre-scaled
        keys = keys.transpose(1, 2)
        values = values.transpose(1, 2)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        if causal:
            mask = torch.full((seqlen, seqlen), float("-inf"), device=x.device)
            mask = torch.triu(mask, diagonal=1)
            scores = scores + mask  # (bs, n_local_heads, seqlen, seqlen)
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = torch.matmul(scores, values)  # (bs, n_local_heads, seqlen, head_dim)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.o_proj(output)
