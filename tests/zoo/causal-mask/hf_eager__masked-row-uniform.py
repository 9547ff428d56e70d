"""Hugging Face's older eager attention (BERT's extended attention mask): the bool mask turned into
an additive `(1.0 - mask) * torch.finfo(dtype).min`, the softmax in the inputs' dtype, no zeroing.
A fully masked row is a row of equal scores: uniform weights, the mean of v.
"""
import torch
from torch import nn


def causal_mask(n_queries, n_keys=None, device=None):
    n_keys = n_queries if n_keys is None else n_keys
    cache_position = torch.arange(n_keys - n_queries, n_keys, device=device)
    kv_arange = torch.arange(n_keys, device=device)
    return kv_arange[None, :] <= cache_position[:, None]


def padding_mask(lengths, max_len):
    batch_size = lengths.shape[0]
    positions = torch.arange(max_len, device=lengths.device).expand(batch_size, max_len)
    return (positions < lengths.unsqueeze(-1)).view(batch_size, 1, 1, max_len)


def masked_attention(query, key, value, mask=None):
    scaling = query.shape[-1] ** -0.5
    attn_weights = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if mask is not None:
        extended = (1.0 - mask.to(query.dtype)) * torch.finfo(query.dtype).min
        attn_weights = attn_weights + extended
    attn_weights = nn.functional.softmax(attn_weights, dim=-1)
    attn_output = torch.matmul(attn_weights, value)
    return attn_output, attn_weights
