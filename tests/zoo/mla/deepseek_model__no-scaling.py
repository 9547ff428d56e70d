"""DeepSeek-V3's inference code (inference/model.py, class MLA): freqs_cis as complex numbers from
torch.polar, RoPE through view_as_complex in float32, einsums over (bsz, seqlen, heads, dim), the
naive and absorbed paths of its attn_impl, and the softmax in float32 cast back (type_as).
A grader could get wrong: the rotation and the softmax run in float32 on float64 inputs (passes
with the float32-inside note); k_pe is rotated with an extra head axis of size 1 and squeezed
before it is cached; DeepSeek's square (seqlen, seqlen) mask is widened to (seqlen, end_pos) here,
since chunks follow a cache.
The bug: the absorbed path's scores, written apart from the naive path's, are never multiplied by
softmax_scale: the naive path is right, and absorption disagrees with it."""
import math

import torch
import torch.nn as nn


def mla_cache_bytes_per_token(kv_lora_rank, qk_rope_dim, n_layers=1, dtype_bytes=2):
    return (kv_lora_rank + qk_rope_dim) * n_layers * dtype_bytes


def kv_cache_bytes_per_token(n_kv_heads, head_dim, n_layers=1, dtype_bytes=2):
    return 2 * n_kv_heads * head_dim * n_layers * dtype_bytes


def precompute_freqs_cis(dim, seqlen, base=10000.0):
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    t = torch.arange(seqlen)
    freqs = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(x, freqs_cis):
    dtype = x.dtype
    x = torch.view_as_complex(x.float().view(*x.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, x.size(1), 1, x.size(-1))
    y = torch.view_as_real(x * freqs_cis).flatten(3)
    return y.to(dtype)


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, d_model, n_heads, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_dim):
        super().__init__()
        self.n_heads = n_heads
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_dim
        self.qk_rope_head_dim = qk_rope_dim
        self.qk_head_dim = qk_nope_dim + qk_rope_dim
        self.v_head_dim = v_dim
        self.wq = nn.Linear(d_model, n_heads * self.qk_head_dim, bias=False)
        self.wkv_a = nn.Linear(d_model, kv_lora_rank + qk_rope_dim, bias=False)
        self.wkv_b = nn.Linear(kv_lora_rank, n_heads * (qk_nope_dim + v_dim), bias=False)
        self.wo = nn.Linear(n_heads * v_dim, d_model, bias=False)
        self.softmax_scale = self.qk_head_dim ** -0.5

    def forward(self, x, cache=None, absorb=False):
        bsz, seqlen, _ = x.size()
        start_pos = 0 if cache is None else cache[0].size(1)
        end_pos = start_pos + seqlen
        freqs_cis = precompute_freqs_cis(self.qk_rope_head_dim, end_pos)[start_pos:end_pos].to(x.device)
        q = self.wq(x).view(bsz, seqlen, self.n_heads, self.qk_head_dim)
        q_nope, q_pe = torch.split(q, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        q_pe = apply_rotary_emb(q_pe, freqs_cis)
        kv = self.wkv_a(x)
        kv, k_pe = torch.split(kv, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        k_pe = apply_rotary_emb(k_pe.unsqueeze(2), freqs_cis).squeeze(2)
        kv_cache = kv if cache is None else torch.cat([cache[0], kv], dim=1)
        pe_cache = k_pe if cache is None else torch.cat([cache[1], k_pe], dim=1)
        if not absorb:
            q = torch.cat([q_nope, q_pe], dim=-1)
            kv = self.wkv_b(kv_cache)
            kv = kv.view(bsz, end_pos, self.n_heads, self.qk_nope_head_dim + self.v_head_dim)
            k_nope, v = torch.split(kv, [self.qk_nope_head_dim, self.v_head_dim], dim=-1)
            k = torch.cat([k_nope, pe_cache.unsqueeze(2).expand(-1, -1, self.n_heads, -1)], dim=-1)
            scores = torch.einsum("bshd,bthd->bsht", q, k) * self.softmax_scale
        else:
            wkv_b = self.wkv_b.weight.view(self.n_heads, -1, self.kv_lora_rank)
            q_nope = torch.einsum("bshd,hdc->bshc", q_nope, wkv_b[:, :self.qk_nope_head_dim])
            scores = (torch.einsum("bshc,btc->bsht", q_nope, kv_cache) +
                      torch.einsum("bshr,btr->bsht", q_pe, pe_cache))
        mask = torch.full((seqlen, end_pos), float("-inf"), device=x.device).triu_(start_pos + 1)
        scores += mask.unsqueeze(1)
        scores = scores.softmax(dim=-1, dtype=torch.float32).type_as(x)
        if not absorb:
            x = torch.einsum("bsht,bthd->bshd", scores, v)
        else:
            x = torch.einsum("bsht,btc->bshc", scores, kv_cache)
            x = torch.einsum("bshc,hdc->bshd", x, wkv_b[:, -self.v_head_dim:])
        x = self.wo(x.flatten(2))
        return x, (kv_cache, pe_cache)
