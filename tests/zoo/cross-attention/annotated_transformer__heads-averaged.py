"""The Annotated Transformer's `attention` and `MultiHeadedAttention` (Harvard NLP) as its decoder
calls them for the source, returning its stored `self.attn` averaged over the heads with the head
axis kept: `self.attn.mean(dim=1, keepdim=True)`, (B, 1, Tq, Tk). The output is right."""
import math

import torch
import torch.nn as nn


def attention(query, key, value, mask=None, dropout=None):
    "Compute 'Scaled Dot Product Attention'"
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, kdim=None, vdim=None):
        "Take in model size and number of heads."
        super().__init__()
        assert d_model % n_heads == 0
        # We assume d_v always equals d_k
        self.d_k = d_model // n_heads
        self.h = n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(kdim or d_model, d_model)
        self.v_proj = nn.Linear(vdim or d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.attn = None

    def forward(self, query, key, value, key_padding_mask=None, attn_mask=None):
        "Implements Figure 2"
        mask = None
        if key_padding_mask is not None:
            mask = key_padding_mask.unsqueeze(-2)   # src_mask: (B, 1, Tk)
        if attn_mask is not None:
            pairs = attn_mask if attn_mask.dim() == 3 else attn_mask.unsqueeze(0)
            mask = pairs if mask is None else mask & pairs
        if mask is not None:
            # Same mask applied to all h heads.
            mask = mask.unsqueeze(1)
        nbatches = query.size(0)

        # 1) Do all the linear projections in batch from d_model => h x d_k
        query, key, value = [
            lin(x).view(nbatches, -1, self.h, self.d_k).transpose(1, 2)
            for lin, x in zip((self.q_proj, self.k_proj, self.v_proj), (query, key, value))
        ]

        # 2) Apply attention on all the projected vectors in batch.
        x, self.attn = attention(query, key, value, mask=mask)

        # 3) "Concat" using a view and apply a final linear.
        x = x.transpose(1, 2).contiguous().view(nbatches, -1, self.h * self.d_k)
        # one map to look at: the heads' mean, the head axis kept
        return self.out_proj(x), self.attn.mean(dim=1, keepdim=True)
