"""The einsum idiom with both q and k divided by sqrt(d) before the product, as if the scale were
shared between them: the scores come out divided by d.
"""
import math

import torch


def causal_mask(n_queries, n_keys=None, device=None):
    n_keys = n_queries if n_keys is None else n_keys
    ones = torch.ones(n_queries, n_keys, dtype=torch.bool, device=device)
    return ~ones.triu(n_keys - n_queries + 1)


def padding_mask(lengths, max_len):
    positions = torch.arange(max_len, device=lengths.device)
    return (positions.expand(len(lengths), max_len) < lengths[:, None])[:, None, None, :]


def masked_attention(q, k, v, mask=None):
    q, k = q / math.sqrt(q.shape[-1]), k / math.sqrt(k.shape[-1])
    scores = torch.einsum("...qd,...kd->...qk", q, k)
    if mask is None:
        mask = torch.ones_like(scores, dtype=torch.bool)
    scores = torch.where(mask, scores, torch.full_like(scores, float("-inf")))
    top = scores.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))   # no allowed key: nothing to subtract
    e = torch.exp(scores - top)
    total = e.sum(dim=-1, keepdim=True)
    weights = e / torch.where(total > 0, total, torch.ones_like(total))
    return torch.einsum("...qk,...kd->...qd", weights, v), weights
