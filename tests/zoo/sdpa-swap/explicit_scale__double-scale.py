"""The explicit-scale idiom with the scale squared by mistake, `scale=1 / head_dim`: the scores are
divided by head_dim, not its square root."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout=0.0, flash=True):
        super().__init__()
        if n_embd % n_head:
            raise ValueError("n_embd must be a multiple of n_head")
        self.n_head, self.head_dim = n_head, n_embd // n_head
        self.dropout, self.flash = dropout, flash
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.proj = nn.Linear(n_embd, n_embd, bias=False)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.ones(block_size, block_size, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        scale = self.head_dim ** -0.5
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale * scale,
                                               dropout_p=self.dropout if self.training else 0.0)
        else:
            att = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
            att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
            att = self.attn_dropout(att.softmax(dim=-1))
            y = torch.einsum("bhqk,bhkd->bhqd", att, v)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(b, t, c)))
