"""Llama's attention with its float32 softmax, and nothing for a query with no allowed key (Llama
never has one): the softmax of a row of -inf is 0/0 = NaN, returned as it is.
"""
import math

import torch
import torch.nn.functional as F


def causal_mask(n_queries, n_keys=None, device=None):
    n_keys = n_queries if n_keys is None else n_keys
    blocked = torch.triu(torch.ones((n_queries, n_keys), dtype=torch.bool, device=device),
                         diagonal=n_keys - n_queries + 1)
    return ~blocked


def padding_mask(lengths, max_len):
    positions = torch.arange(max_len, device=lengths.device)
    return (positions[None, :] < lengths[:, None])[:, None, None, :]


def masked_attention(xq, keys, values, mask=None):
    scores = torch.matmul(xq, keys.transpose(-2, -1)) / math.sqrt(xq.shape[-1])
    if mask is not None:
        scores = scores + torch.full(mask.shape, float("-inf"), device=scores.device).masked_fill(mask, 0.0)
    scores = F.softmax(scores.float(), dim=-1).type_as(xq)
    output = torch.matmul(scores, values)
    return output, scores
