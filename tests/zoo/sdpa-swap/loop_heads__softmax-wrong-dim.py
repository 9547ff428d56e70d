"""The loop over heads, whose manual path normalises each head's (B, T, T) scores with
`F.softmax(att, dim=1)`: axis 1 of (B, T_query, T_key) is the queries', so each key's column sums to
1 and no query's weights over the keys do; the flash path's SDPA is right, and the paths disagree
(softmax-wrong-dim)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int, dropout: float = 0.0, flash: bool = True):
        super().__init__()
        if n_embd % n_head != 0:
            raise ValueError("n_head must divide n_embd")
        self.n_head, self.hd, self.p, self.flash = n_head, n_embd // n_head, dropout, flash
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.proj = nn.Linear(n_embd, n_embd, bias=False)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.tril(torch.ones(block_size, block_size, dtype=torch.bool)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.reshape(B, T, self.n_head, self.hd).transpose(1, 2) for t in self.qkv(x).split(C, dim=-1))
        if self.flash:
            y = F.scaled_dot_product_attention(query=q, key=k, value=v, is_causal=True,
                                               dropout_p=self.p if self.training else 0.0)
        else:
            heads = []
            for h in range(self.n_head):
                att = q[:, h] @ k[:, h].transpose(-2, -1) / math.sqrt(self.hd)
                att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
                heads.append(self.attn_dropout(F.softmax(att, dim=1)) @ v[:, h])
            y = torch.stack(heads, dim=1)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(B, T, C)))
