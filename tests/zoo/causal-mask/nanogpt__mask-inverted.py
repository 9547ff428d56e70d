"""nanoGPT's idiom with the triangle of nn.MultiheadAttention's convention: `torch.triu(..., diagonal=1)`
is True on the future, which that API masks out and this kit's convention lets through.
"""
import math

import torch
import torch.nn.functional as F


def causal_mask(n_queries, n_keys=None, device=None):
    n_keys = n_queries if n_keys is None else n_keys
    bias = torch.triu(torch.ones(n_queries, n_keys, device=device), diagonal=n_keys - n_queries + 1)
    return bias == 1


def padding_mask(lengths, max_len):
    keep = torch.arange(max_len, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)
    return keep.unsqueeze(1).unsqueeze(1)


def masked_attention(q, k, v, mask=None):
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    if mask is not None:
        att = att.masked_fill(mask == 0, float("-inf"))
    att = F.softmax(att, dim=-1)
    att = torch.nan_to_num(att, nan=0.0)   # a row of -inf is 0/0: no key to attend to, no weight
    y = att @ v
    return y, att
