import math

import torch


def causal_mask(n_queries, n_keys=None, device=None):
    n_keys = n_queries if n_keys is None else n_keys
    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril(n_keys - n_queries)


def padding_mask(lengths, max_len):
    return (torch.arange(max_len, device=lengths.device) < lengths[:, None])[:, None, None, :]


def masked_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return weights @ v, weights
