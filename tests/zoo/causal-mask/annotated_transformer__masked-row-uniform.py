"""The Annotated Transformer's attention as published: `scores.masked_fill(mask == 0, -1e9)` and no
more. A query with no allowed key gets uniform weights and the mean of v instead of zeros.
"""
import math

import torch


def causal_mask(n_queries, n_keys=None, device=None):
    n_keys = n_queries if n_keys is None else n_keys
    attn_shape = (n_queries, n_keys)
    subsequent = torch.triu(torch.ones(attn_shape, device=device), diagonal=n_keys - n_queries + 1).type(torch.uint8)
    return subsequent == 0


def padding_mask(lengths, max_len):
    return (torch.arange(max_len, device=lengths.device) < lengths.unsqueeze(-1)).unsqueeze(-2).unsqueeze(-2)


def masked_attention(query, key, value, mask=None):
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    return torch.matmul(p_attn, value), p_attn
