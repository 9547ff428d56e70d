"""An einsum version, as people write it to avoid transposes: heads kept as an axis of
(B, T, H, hd), scores `einsum("bqhd,bkhd->bhqk")`, the output `einsum("bhqk,bkhd->bqhd")`, both
masks folded into one (B, 1, Tq, Tk) bool mask with logical_and, and torch.where with -inf.

What a grader could get wrong: no matmul and no transpose anywhere (a recorder that looks for
`matmul` operands would see no scores; they show up only as the softmax's input), and the masks
broadcast by torch.where rather than masked_fill."""
import torch
import torch.nn as nn


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, kdim=None, vdim=None):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} does not divide d_model={d_model}")
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model if kdim is None else kdim, d_model)
        self.v_proj = nn.Linear(d_model if vdim is None else vdim, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, key_padding_mask=None, attn_mask=None):
        B, Tq, C = query.shape
        Tk = key.shape[1]
        q = self.q_proj(query).view(B, Tq, self.n_heads, self.head_dim)
        k = self.k_proj(key).view(B, Tk, self.n_heads, self.head_dim)
        v = self.v_proj(value).view(B, Tk, self.n_heads, self.head_dim)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * self.head_dim ** -0.5
        allowed = torch.ones(B, 1, Tq, Tk, dtype=torch.bool, device=query.device)
        if key_padding_mask is not None:
            allowed = torch.logical_and(allowed, key_padding_mask[:, None, None, :])
        if attn_mask is not None:
            allowed = torch.logical_and(allowed, attn_mask if attn_mask.dim() == 2 else attn_mask[:, None])
        scores = torch.where(allowed, scores, torch.full_like(scores, float("-inf")))
        weights = torch.softmax(scores, dim=-1)
        out = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(B, Tq, C)
        return self.out_proj(out), weights
