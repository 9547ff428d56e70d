"""The kit's file with a Llama-style loop, its softmax in float32 inside, and the scores never
divided by sqrt(head_dim)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# Given code: the kit's vectorised attention, as nanoGPT writes it. Do not change this class: the
# grader checks it against the original, and mha_by_loop must reproduce what it computes.
class CausalSelfAttention(nn.Module):
    """Causal multi-head self-attention as nanoGPT writes it: every head at once. Given code: do not change it.

    ``qkv`` is one ``nn.Linear(n_embd, 3 * n_embd, bias=False)`` whose weight rows are stacked
    [W_q; W_k; W_v]; ``proj`` mixes the heads. Head h owns channels h*head_dim to (h+1)*head_dim
    of q, k and v.
    """

    def __init__(self, n_embd: int, n_head: int, block_size: int):
        """Raises ValueError unless ``n_head`` divides ``n_embd``; sequences may be up to ``block_size`` long."""
        super().__init__()
        if n_embd % n_head != 0:
            raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        self.n_head, self.head_dim = n_head, n_embd // n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=False)   # weight (3C, C): rows stacked [W_q; W_k; W_v]
        self.proj = nn.Linear(n_embd, n_embd, bias=False)
        # True = may attend. Not persistent: it follows from block_size, so the state_dict holds only weights.
        self.register_buffer("mask", torch.ones(block_size, block_size, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, n_embd) -> (B, T, n_embd)."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)   # (B, T, C) each
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))   # (B, H, T, hd)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)   # (B, H, T, T)
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        y = F.softmax(att, dim=-1) @ v   # (B, H, T, hd)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))   # (B, T, C)


def mha_by_loop(mha, x: torch.Tensor) -> torch.Tensor:
    """``mha(x)`` computed one head at a time, without calling ``mha`` or SDPA.

    A Python loop over the ``mha.n_head`` heads: head i attends causally on its channel slice
    [i*head_dim:(i+1)*head_dim] of the full-width q, k and v; the heads' outputs are concatenated
    and projected by ``mha.proj``. x (B, T, C) -> (B, T, C).
    """
    B, T, C = x.shape
    hd = mha.head_dim
    xq, xk, xv = mha.qkv(x).chunk(3, dim=-1)
    mask = torch.full((T, T), float("-inf"), device=x.device).triu(1)
    outputs = []
    for h in range(mha.n_head):
        q, k, v = (t[..., h * hd:(h + 1) * hd] for t in (xq, xk, xv))
        scores = torch.matmul(q, k.transpose(1, 2)) + mask
        scores = F.softmax(scores.float(), dim=-1).type_as(q)
        outputs.append(torch.matmul(scores, v))
    return mha.proj(torch.cat(outputs, dim=-1))
