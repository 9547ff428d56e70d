"""Hugging Face's eager attention over document ids, with the scaling left out: `torch.matmul(q,
k.transpose(-2, -1))` goes to the mask and the softmax as it is, never multiplied by
head_dim ** -0.5 (no-scaling)."""
import torch
from torch import nn


def document_ids(cu_seqlens):
    T = int(cu_seqlens[-1])
    starts = torch.zeros(T + 1, dtype=torch.long, device=cu_seqlens.device)
    starts.index_add_(0, cu_seqlens[1:-1].long(), torch.ones_like(cu_seqlens[1:-1], dtype=torch.long))
    return starts[:T].cumsum(0)


def position_ids(cu_seqlens):
    doc_ids = document_ids(cu_seqlens)
    return torch.arange(len(doc_ids), device=cu_seqlens.device) - cu_seqlens.long()[doc_ids]


def document_mask(cu_seqlens):
    doc_ids = document_ids(cu_seqlens)
    T = len(doc_ids)
    causal = torch.ones(T, T, dtype=torch.bool, device=cu_seqlens.device).tril()
    return (doc_ids[:, None] == doc_ids[None, :]) & causal


def prefix_lm_mask(cu_seqlens, prefix_lens):
    doc_ids = document_ids(cu_seqlens)
    token_type_ids = position_ids(cu_seqlens) >= prefix_lens.to(cu_seqlens.device)[doc_ids]   # 0 = prefix
    T = len(doc_ids)
    causal = torch.ones(T, T, dtype=torch.bool, device=cu_seqlens.device).tril()
    return (doc_ids[:, None] == doc_ids[None, :]) & (causal | ~token_type_ids[None, :])


def packed_attention(q, k, v, cu_seqlens, prefix_lens=None):
    if prefix_lens is None:
        attention_mask = document_mask(cu_seqlens)
    else:
        attention_mask = prefix_lm_mask(cu_seqlens, prefix_lens)
    attn_weights = torch.matmul(q, k.transpose(-2, -1))
    attn_weights = attn_weights.masked_fill(~attention_mask.to(q.device), torch.finfo(attn_weights.dtype).min)
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(attn_weights, v)
