"""vLLM's MLA backend (MLACommonImpl) as in vllm_bmm.py, W_UK_T and W_UV from the transposed
kv_b_proj weight, bmm over heads first, [c_kv | k_pe] scored in one matmul, with the causal mask
built from the rows and columns of the (T, S) score block, `col <= row`, as for a prefill that
starts at position 0: with a cache, a decoded token's row 0 sees only key 0."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def mla_cache_bytes_per_token(kv_lora_rank, qk_rope_dim, n_layers=1, dtype_bytes=2):
    per_layer = kv_lora_rank + qk_rope_dim
    return int(per_layer * n_layers * dtype_bytes)


def kv_cache_bytes_per_token(n_kv_heads, head_dim, n_layers=1, dtype_bytes=2):
    k_bytes = n_kv_heads * head_dim * dtype_bytes
    return int(2 * k_bytes * n_layers)


def rope(x, positions):
    d = x.shape[-1]
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d))
    freqs = positions.double()[:, None] * inv_freq[None, :]
    shape = [1, len(positions)] + [1] * (x.dim() - 3) + [d // 2]
    cos, sin = freqs.cos().to(x.dtype).view(shape), freqs.sin().to(x.dtype).view(shape)
    x1, x2 = x[..., ::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., ::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x2 * cos + x1 * sin
    return out


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, d_model, n_heads, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_dim):
        super().__init__()
        self.num_heads, self.kv_lora_rank = n_heads, kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = qk_nope_dim, qk_rope_dim, v_dim
        self.scale = 1.0 / math.sqrt(qk_nope_dim + qk_rope_dim)
        self.wq = nn.Linear(d_model, n_heads * (qk_nope_dim + qk_rope_dim), bias=False)
        self.wkv_a = nn.Linear(d_model, kv_lora_rank + qk_rope_dim, bias=False)
        self.wkv_b = nn.Linear(kv_lora_rank, n_heads * (qk_nope_dim + v_dim), bias=False)
        self.wo = nn.Linear(n_heads * v_dim, d_model, bias=False)

    def weights_after_loading(self):
        kv_b_proj_weight = self.wkv_b.weight.T   # (kv_lora_rank, heads * (nope + v))
        kv_b_proj_weight = kv_b_proj_weight.view(self.kv_lora_rank, self.num_heads,
                                                 self.qk_nope_head_dim + self.v_head_dim)
        W_UK, W_UV = kv_b_proj_weight.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        W_UK_T = W_UK.permute(1, 2, 0)   # (heads, nope, rank)
        W_UV = W_UV.transpose(0, 1)   # (heads, rank, v)
        return W_UK_T, W_UV

    def forward(self, x, cache=None, absorb=False):
        B, T, _ = x.shape
        H, P, L = self.num_heads, self.qk_nope_head_dim, self.kv_lora_rank
        past = 0 if cache is None else cache[0].shape[1]
        positions = torch.arange(past, past + T, device=x.device)
        q = self.wq(x).view(B, T, H, P + self.qk_rope_head_dim)
        q_nope, q_pe = q[..., :P], rope(q[..., P:], positions)
        kv_c, k_pe = self.wkv_a(x).split([L, self.qk_rope_head_dim], dim=-1)
        k_pe = rope(k_pe, positions)
        if cache is not None:
            kv_c, k_pe = torch.cat([cache[0], kv_c], dim=1), torch.cat([cache[1], k_pe], dim=1)
        S = kv_c.shape[1]
        mask = torch.arange(S, device=x.device)[None, :] <= torch.arange(T, device=x.device)[:, None]
        if absorb:
            W_UK_T, W_UV = self.weights_after_loading()
            ql_nope = torch.bmm(q_nope.reshape(B * T, H, P).transpose(0, 1), W_UK_T)   # (H, B*T, L)
            ql_nope = ql_nope.transpose(0, 1).reshape(B, T, H, L)
            q_cat = torch.cat([ql_nope, q_pe], dim=-1).transpose(1, 2)   # (B, H, T, L + R)
            kv_c_and_k_pe_cache = torch.cat([kv_c, k_pe], dim=-1)   # (B, S, L + R)
            scores = torch.matmul(q_cat, kv_c_and_k_pe_cache[:, None].transpose(-1, -2)) * self.scale
            probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
            o_latent = torch.matmul(probs, kv_c[:, None])   # (B, H, T, L)
            o = torch.bmm(o_latent.permute(1, 0, 2, 3).reshape(H, B * T, L), W_UV)   # (H, B*T, V)
            o = o.view(H, B, T, self.v_head_dim).permute(1, 2, 0, 3)
        else:
            kv = F.linear(kv_c, self.wkv_b.weight).view(B, S, H, P + self.v_head_dim)
            k_nope, v = kv[..., :P], kv[..., P:]
            k = torch.cat([k_nope, k_pe[:, :, None].expand(B, S, H, self.qk_rope_head_dim)], dim=-1)
            q_full = torch.cat([q_nope, q_pe], dim=-1)
            scores = torch.matmul(q_full.transpose(1, 2), k.permute(0, 2, 3, 1)) * self.scale
            probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
            o = torch.matmul(probs, v.transpose(1, 2)).transpose(1, 2)
        return self.wo(o.reshape(B, T, H * self.v_head_dim)), (kv_c, k_pe)
