"""nanoGPT's idiom (karpathy/nanoGPT, model.py): a lower-triangular buffer compared with `== 0`,
`masked_fill(..., float('-inf'))`, `F.softmax`, and `* (1.0 / math.sqrt(k.size(-1)))` for the scale.

What a grader could get wrong: `mask == 0` on a bool mask (True where attention is NOT allowed),
a scale multiplied rather than divided (last-ulp differences), and fully masked rows cleaned with
`torch.nan_to_num` after the softmax instead of a masked_fill: the weights are the same zeros.
"""
import math

import torch
import torch.nn.functional as F


def causal_mask(n_queries, n_keys=None, device=None):
    n_keys = n_queries if n_keys is None else n_keys
    bias = torch.tril(torch.ones(n_queries, n_keys, device=device), diagonal=n_keys - n_queries)
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
