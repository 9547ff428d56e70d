"""Hugging Face's eager attention with the softmax over the queries, `dim=-2` of the
(..., Tq, Tk) weights, where `dim=-1`, the keys, belongs: each key's weights sum to 1 across the queries.
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
        attn_weights = attn_weights.masked_fill(mask.logical_not(), float("-inf"))
    attn_weights = nn.functional.softmax(attn_weights, dim=-2, dtype=torch.float32).to(query.dtype)
    if mask is not None:
        attn_weights = attn_weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    attn_output = torch.matmul(attn_weights, value)
    return attn_output, attn_weights
