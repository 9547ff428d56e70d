"""Hugging Face's position ids as a cumsum (`attention_mask.long().cumsum(-1) - 1`), restarted at
each document by subtracting its start, with the `- 1` left out: a cumsum of ones counts from 1, so
every document's positions run 1 .. n instead of 0 .. n - 1, and the prefix-LM mask that compares
them with prefix_lens gives each prefix one token less (position-off-by-one)."""
import torch
from torch import nn


def document_ids(cu_seqlens):
    T = int(cu_seqlens[-1])
    starts = torch.zeros(T + 1, dtype=torch.long, device=cu_seqlens.device)
    starts.index_add_(0, cu_seqlens[1:-1].long(), torch.ones_like(cu_seqlens[1:-1], dtype=torch.long))
    return starts[:T].cumsum(0)


def position_ids(cu_seqlens):
    doc_ids = document_ids(cu_seqlens)
    return torch.ones_like(doc_ids).cumsum(0) - cu_seqlens.long()[doc_ids]


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
    scaling = q.shape[-1] ** -0.5
    if prefix_lens is None:
        attention_mask = document_mask(cu_seqlens)
    else:
        attention_mask = prefix_lm_mask(cu_seqlens, prefix_lens)
    attn_weights = torch.matmul(q, k.transpose(-2, -1)) * scaling
    attn_weights = attn_weights.masked_fill(~attention_mask.to(q.device), torch.finfo(attn_weights.dtype).min)
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(attn_weights, v)
