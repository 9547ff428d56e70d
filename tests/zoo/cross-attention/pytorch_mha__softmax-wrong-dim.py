"""PyTorch's own nn.MultiheadAttention forward (`F.multi_head_attention_forward`) with the softmax
on the wrong axis: the scores are (B * n_heads, Tq, Tk), heads folded into the batch, and
`F.softmax(attn_output_weights, dim=1)` normalises over the target's Tq queries, not the source's
Tk keys. A padded key's column is all -inf, so its weights come out NaN."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, kdim=None, vdim=None):
        super().__init__()
        self.embed_dim = d_model
        self.kdim = kdim if kdim is not None else d_model
        self.vdim = vdim if vdim is not None else d_model
        self.num_heads = n_heads
        self.head_dim = d_model // n_heads
        assert self.head_dim * n_heads == self.embed_dim, "embed_dim must be divisible by num_heads"
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(self.kdim, d_model)
        self.v_proj = nn.Linear(self.vdim, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, key_padding_mask=None, attn_mask=None):
        bsz, tgt_len, embed_dim = query.shape
        src_len = key.shape[1]
        query, key, value = (x.transpose(0, 1) for x in (query, key, value))   # (T, B, E) inside
        q = F.linear(query, self.q_proj.weight, self.q_proj.bias)
        k = F.linear(key, self.k_proj.weight, self.k_proj.bias)
        v = F.linear(value, self.v_proj.weight, self.v_proj.bias)

        # one float mask (bsz * num_heads, tgt_len, src_len): 0 where allowed, -inf where not
        merged = torch.zeros(bsz * self.num_heads, tgt_len, src_len, dtype=q.dtype, device=q.device)
        if attn_mask is not None:
            blocked = attn_mask.logical_not()
            if blocked.dim() == 3:
                blocked = blocked.repeat_interleave(self.num_heads, dim=0)
            merged = merged.masked_fill(blocked, float("-inf"))
        if key_padding_mask is not None:
            blocked = key_padding_mask.logical_not().view(bsz, 1, 1, src_len)
            blocked = blocked.expand(-1, self.num_heads, -1, -1).reshape(bsz * self.num_heads, 1, src_len)
            merged = merged.masked_fill(blocked, float("-inf"))

        q = q.view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        k = k.view(src_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        v = v.view(src_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        q_scaled = q * math.sqrt(1.0 / float(self.head_dim))
        attn_output_weights = torch.baddbmm(merged, q_scaled, k.transpose(-2, -1))
        attn_output_weights = F.softmax(attn_output_weights, dim=1)
        attn_output = torch.bmm(attn_output_weights, v)
        attn_output = attn_output.transpose(0, 1).contiguous().view(tgt_len * bsz, embed_dim)
        attn_output = F.linear(attn_output, self.out_proj.weight, self.out_proj.bias)
        attn_output = attn_output.view(tgt_len, bsz, embed_dim).transpose(0, 1)
        return attn_output, attn_output_weights.view(bsz, self.num_heads, tgt_len, src_len)
