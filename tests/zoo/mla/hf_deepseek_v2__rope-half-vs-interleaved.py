"""Hugging Face's DeepseekV2Attention (modeling_deepseek.py) as a learner copies it from Llama's:
a cos/sin cache with the frequencies repeated, cat((freqs, freqs), -1), and rotate_half applied to
q_pe and k_pe as they come, without DeepSeek's permutation of each RoPE vector from interleaved
pairs to halves. (bsz, heads, q_len, dim) layout, matmul scores, an additive float mask, a float32
softmax cast back; the absorbed path folds W_uk and W_uv with matmul on (heads, ...) weights."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def mla_cache_bytes_per_token(kv_lora_rank, qk_rope_dim, n_layers=1, dtype_bytes=2):
    return n_layers * dtype_bytes * (kv_lora_rank + qk_rope_dim)


def kv_cache_bytes_per_token(n_kv_heads, head_dim, n_layers=1, dtype_bytes=2):
    return n_layers * dtype_bytes * n_kv_heads * head_dim * 2


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, d_model, n_heads, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_dim):
        super().__init__()
        self.num_heads = n_heads
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_dim
        self.qk_rope_head_dim = qk_rope_dim
        self.v_head_dim = v_dim
        self.q_head_dim = qk_nope_dim + qk_rope_dim
        self.wq = nn.Linear(d_model, n_heads * self.q_head_dim, bias=False)
        self.wkv_a = nn.Linear(d_model, kv_lora_rank + qk_rope_dim, bias=False)
        self.wkv_b = nn.Linear(kv_lora_rank, n_heads * (qk_nope_dim + v_dim), bias=False)
        self.wo = nn.Linear(n_heads * v_dim, d_model, bias=False)
        self.softmax_scale = self.q_head_dim ** (-0.5)

    def rotary(self, seq_len, dtype, device):
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, self.qk_rope_head_dim, 2, dtype=torch.float64, device=device)
                                      / self.qk_rope_head_dim))
        t = torch.arange(seq_len, device=device, dtype=torch.float64)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, hidden_states, cache=None, absorb=False):
        bsz, q_len, _ = hidden_states.size()
        past = 0 if cache is None else cache[0].shape[1]
        kv_seq_len = past + q_len
        q = self.wq(hidden_states).view(bsz, q_len, self.num_heads, self.q_head_dim).transpose(1, 2)
        q_nope, q_pe = torch.split(q, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        compressed_kv = self.wkv_a(hidden_states)
        compressed_kv, k_pe = torch.split(compressed_kv, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        cos, sin = self.rotary(kv_seq_len, hidden_states.dtype, hidden_states.device)
        cos, sin = cos[past:], sin[past:]
        q_pe = q_pe * cos + rotate_half(q_pe) * sin
        k_pe = k_pe * cos + rotate_half(k_pe) * sin
        if cache is not None:
            compressed_kv = torch.cat([cache[0], compressed_kv], dim=1)
            k_pe = torch.cat([cache[1], k_pe], dim=1)
        k_pe_heads = k_pe[:, None]
        if not absorb:
            kv = self.wkv_b(compressed_kv).view(bsz, kv_seq_len, self.num_heads, self.qk_nope_head_dim + self.v_head_dim)
            kv = kv.transpose(1, 2)
            k_nope, value_states = torch.split(kv, [self.qk_nope_head_dim, self.v_head_dim], dim=-1)
            query_states = torch.cat([q_nope, q_pe], dim=-1)
            key_states = torch.cat([k_nope, k_pe_heads.expand(-1, self.num_heads, -1, -1)], dim=-1)
            attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) * self.softmax_scale
        else:
            w = self.wkv_b.weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
            q_latent = torch.matmul(q_nope, w[:, :self.qk_nope_head_dim])
            attn_weights = (torch.matmul(q_latent, compressed_kv[:, None].transpose(2, 3)) +
                            torch.matmul(q_pe, k_pe_heads.transpose(2, 3))) * self.softmax_scale
        attention_mask = torch.zeros(q_len, kv_seq_len, dtype=attn_weights.dtype, device=attn_weights.device)
        attention_mask.masked_fill_(torch.ones(q_len, kv_seq_len, dtype=torch.bool, device=attention_mask.device)
                                    .triu(past + 1), float("-inf"))
        attn_weights = attn_weights + attention_mask
        attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(q_pe.dtype)
        if not absorb:
            attn_output = torch.matmul(attn_weights, value_states)
        else:
            latent_output = torch.matmul(attn_weights, compressed_kv[:, None])
            attn_output = torch.matmul(latent_output, w[:, self.qk_nope_head_dim:].transpose(1, 2))
        attn_output = attn_output.transpose(1, 2).reshape(bsz, q_len, self.num_heads * self.v_head_dim)
        return self.wo(attn_output), (compressed_kv, k_pe)
