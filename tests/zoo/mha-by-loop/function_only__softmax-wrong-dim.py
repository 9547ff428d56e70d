"""A function-only file that normalises each head's (B, T, T) scores with `F.softmax(scores, dim=1)`:
axis 1 is the queries, so each key's column sums to 1 instead of each query's row."""
import math

import torch
import torch.nn.functional as F


def mha_by_loop(mha, x):
    B, T, C = x.shape
    hd = mha.head_dim
    q, k, v = mha.qkv(x).split(C, dim=-1)
    causal = torch.tril(torch.ones(T, T, device=x.device)).bool()
    heads = []
    for h in range(mha.n_head):
        cols = slice(h * hd, (h + 1) * hd)
        scores = q[:, :, cols] @ k[:, :, cols].transpose(-2, -1) / math.sqrt(hd)
        scores = scores.masked_fill(~causal, float("-inf"))
        heads.append(F.softmax(scores, dim=1) @ v[:, :, cols])
    return mha.proj(torch.cat(heads, dim=-1))
