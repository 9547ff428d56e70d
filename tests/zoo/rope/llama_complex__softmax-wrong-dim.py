"""Meta's Llama attention normalised over the queries: `F.softmax(scores.float(), dim=2)` on scores
shaped (bsz, n_heads, seqlen, cache_len), where dim 2 is seqlen, the queries, not the keys."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def precompute_freqs_cis(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)   # complex64


def rope_cache(T, head_dim, base=10000.0, dtype=torch.float32):
    assert head_dim % 2 == 0, f"head_dim {head_dim} must be even"
    freqs_cis = precompute_freqs_cis(head_dim, T, base)
    return freqs_cis.real.to(dtype), freqs_cis.imag.to(dtype)


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis[None, :, None, :]   # (1, T, 1, hd/2): broadcast over batch and heads
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def apply_rope(x, cos, sin, positions):
    freqs_cis = torch.complex(cos[positions].float(), sin[positions].float())
    out, _ = apply_rotary_emb(x.transpose(1, 2), x.transpose(1, 2), freqs_cis)
    return out.transpose(1, 2)


class RoPEAttention(nn.Module):
    def __init__(self, d_model, n_heads, max_len=2048, base=10000.0):
        super().__init__()
        assert d_model % n_heads == 0, "n_heads must divide d_model"
        self.n_local_heads = n_heads
        self.head_dim = d_model // n_heads
        assert self.head_dim % 2 == 0, "head_dim must be even"
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        self.freqs_cis = precompute_freqs_cis(self.head_dim, max_len, base)

    def forward(self, x, past_kv=None):
        bsz, seqlen, _ = x.shape
        start_pos = 0 if past_kv is None else past_kv[0].shape[2]
        self.freqs_cis = self.freqs_cis.to(x.device)
        freqs_cis = self.freqs_cis[start_pos: start_pos + seqlen]
        xq = self.q_proj(x).view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xk = self.k_proj(x).view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xv = self.v_proj(x).view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)
        keys, values = xk.transpose(1, 2), xv.transpose(1, 2)
        if past_kv is not None:
            keys = torch.cat([past_kv[0], keys], dim=2)
            values = torch.cat([past_kv[1], values], dim=2)
        xq = xq.transpose(1, 2)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        mask = torch.full((seqlen, seqlen), float("-inf"), device=x.device)
        mask = torch.triu(mask, diagonal=1)
        mask = torch.hstack([torch.zeros((seqlen, start_pos), device=x.device), mask]).type_as(xq)
        scores = scores + mask
        scores = F.softmax(scores.float(), dim=2).type_as(xq)
        output = torch.matmul(scores, values)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.o_proj(output), (keys, values)
