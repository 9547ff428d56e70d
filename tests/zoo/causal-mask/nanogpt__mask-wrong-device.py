"""nanoGPT's idiom with the mask built on the CPU whatever `device` says (nanoGPT's buffer moves with
the module; a function's tensor does not).
"""
import math

import torch
import torch.nn.functional as F


def causal_mask(n_queries, n_keys=None, device=None):
    n_keys = n_queries if n_keys is None else n_keys
    bias = torch.tril(torch.ones(n_queries, n_keys), diagonal=n_keys - n_queries)
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
