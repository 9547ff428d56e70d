"""Known causal-mask bugs, each a complete function with exactly that mistake."""
import math

import torch
import torch.nn.functional as F


def causal_mask_inverted(n_queries, n_keys=None, device=None):
    n_keys = n_queries if n_keys is None else n_keys
    ones = torch.ones(n_queries, n_keys, dtype=torch.bool, device=device)
    return ones.triu(n_keys - n_queries + 1)   # True on the future: nn.MultiheadAttention's convention


def causal_mask_excludes_diagonal(n_queries, n_keys=None, device=None):
    n_keys = n_queries if n_keys is None else n_keys
    ones = torch.ones(n_queries, n_keys, dtype=torch.bool, device=device)
    return ones.tril(n_keys - n_queries - 1)   # one step too far: a query may not see itself


def causal_mask_top_left(n_queries, n_keys=None, device=None):
    n_keys = n_queries if n_keys is None else n_keys
    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril()   # is_causal=True's alignment


def causal_mask_wrong_device(n_queries, n_keys=None, device=None):
    n_keys = n_queries if n_keys is None else n_keys
    return torch.ones(n_queries, n_keys, dtype=torch.bool).tril(n_keys - n_queries)   # device ignored


def padding_mask_inverted(lengths, max_len):
    positions = torch.arange(max_len, device=lengths.device)
    return (positions >= lengths[:, None])[:, None, None, :]   # True on the padding


def masked_attention_nan(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)   # an all -inf row is 0/0 = NaN, left as it is
    return weights @ v, weights


def masked_attention_minus_1e9(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)   # the annotated transformer's fill: a row of -1e9 is uniform
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def masked_attention_finfo_min(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)   # Hugging Face's eager fill, as uniform
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def masked_attention_no_scaling(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1)   # the scores left unscaled
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return weights @ v, weights


def masked_attention_double_scale(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / q.size(-1)   # 1/sqrt(d) twice: divided by d
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return weights @ v, weights


def masked_attention_softmax_wrong_dim(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-2)   # normalised over the queries, not the keys
    if mask is not None:
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return weights @ v, weights


def masked_attention_banned(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), weights


BUGS = {
    "mask-inverted": {"causal_mask": causal_mask_inverted},
    "mask-excludes-diagonal": {"causal_mask": causal_mask_excludes_diagonal},
    "mask-top-left-aligned": {"causal_mask": causal_mask_top_left},
    "mask-wrong-device": {"causal_mask": causal_mask_wrong_device},
    "padding-mask-inverted": {"padding_mask": padding_mask_inverted},
    "nan-on-fully-masked-row": {"masked_attention": masked_attention_nan},
    "masked-row-uniform": [{"masked_attention": masked_attention_minus_1e9},
                           {"masked_attention": masked_attention_finfo_min}],
    "no-scaling": {"masked_attention": masked_attention_no_scaling},
    "double-scale": {"masked_attention": masked_attention_double_scale},
    "softmax-wrong-dim": {"masked_attention": masked_attention_softmax_wrong_dim},
    "banned-api": {"masked_attention": masked_attention_banned},
}
