"""One head at a time, with each head's (B, Tq, Tk) scores never divided by sqrt(head_dim)."""
import torch
import torch.nn as nn


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, kdim=None, vdim=None):
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError("d_model must be a multiple of n_heads")
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(kdim if kdim else d_model, d_model)
        self.v_proj = nn.Linear(vdim if vdim else d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, key_padding_mask=None, attn_mask=None):
        B, Tq, _ = query.shape
        Tk = key.shape[1]
        q, k, v = self.q_proj(query), self.k_proj(key), self.v_proj(value)
        allowed = torch.ones(B, Tq, Tk, dtype=torch.bool, device=query.device)
        if key_padding_mask is not None:
            allowed = allowed & key_padding_mask[:, None, :]
        if attn_mask is not None:
            allowed = allowed & attn_mask
        outputs, weights = [], []
        for h in range(self.n_heads):
            cols = slice(h * self.head_dim, (h + 1) * self.head_dim)
            scores = q[..., cols] @ k[..., cols].transpose(1, 2)
            scores = scores.masked_fill(~allowed, float("-inf"))
            w = torch.softmax(scores, dim=-1)
            outputs.append(w @ v[..., cols])
            weights.append(w)
        return self.out_proj(torch.cat(outputs, dim=-1)), torch.stack(weights, dim=1)
