"""Hugging Face's rotate_half, as its Llama code rotates: the halves paired, where the kata's
cos and sin turn interleaved pairs."""
import math

import torch
import torch.nn.functional as F


def _default(head_dim, base):
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def rope_inv_freq(head_dim, base=10000.0):
    return _default(head_dim, base).double()


def linear_inv_freq(head_dim, base, factor):
    inv_freq = _default(head_dim, base)
    inv_freq /= factor
    return inv_freq.double()


def ntk_inv_freq(head_dim, base, factor):
    base = base * factor ** (head_dim / (head_dim - 2))
    return _default(head_dim, base).double()


def yarn_inv_freq(head_dim, base, factor, original_max_len, beta_fast=32.0, beta_slow=1.0):
    dim = head_dim

    def find_correction_dim(num_rotations, dim, base, max_position_embeddings):
        return (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    def find_correction_range(low_rot, high_rot, dim, base, max_position_embeddings):
        low = math.floor(find_correction_dim(low_rot, dim, base, max_position_embeddings))
        high = math.ceil(find_correction_dim(high_rot, dim, base, max_position_embeddings))
        return max(low, 0), min(high, dim - 1)

    def linear_ramp_factor(min, max, dim):
        if min == max:
            max += 0.001
        linear_func = (torch.arange(dim, dtype=torch.float32) - min) / (max - min)
        return torch.clamp(linear_func, 0, 1)

    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    low, high = find_correction_range(beta_fast, beta_slow, dim, base, original_max_len)
    inv_freq_extrapolation_factor = 1 - linear_ramp_factor(low, high, dim // 2)
    inv_freq = (inv_freq_interpolation * (1 - inv_freq_extrapolation_factor)
                + inv_freq_extrapolation * inv_freq_extrapolation_factor)
    return inv_freq.double()


def yarn_attention_factor(factor):
    if factor <= 1:
        return 1.0
    return 0.1 * math.log(factor) + 1.0


def llama3_inv_freq(head_dim, base, factor, original_max_len, low_freq_factor=1.0, high_freq_factor=4.0):
    inv_freq = _default(head_dim, base)
    old_context_len = original_max_len
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    inv_freq_llama = torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)
    return inv_freq_llama.double()


ROPE_INIT_FUNCTIONS = {
    "default": lambda d, b, s: rope_inv_freq(d, b),
    "linear": lambda d, b, s: linear_inv_freq(d, b, s["factor"]),
    "ntk": lambda d, b, s: ntk_inv_freq(d, b, s["factor"]),
    "yarn": lambda d, b, s: yarn_inv_freq(d, b, s["factor"], s["original_max_position_embeddings"],
                                          s.get("beta_fast") or 32, s.get("beta_slow") or 1),
    "llama3": lambda d, b, s: llama3_inv_freq(d, b, s["factor"], s["original_max_position_embeddings"],
                                              s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)),
}


def scaled_rope(positions, head_dim, base=10000.0, rope_scaling=None, dtype=torch.float32):
    rope_scaling = rope_scaling or {"rope_type": "default"}
    rope_type = rope_scaling.get("rope_type", rope_scaling.get("type"))   # BC: "rope_type" was originally "type"
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"Unrecognized rope_type: {rope_type}")
    inv_freq = ROPE_INIT_FUNCTIONS[rope_type](head_dim, base, rope_scaling)
    freqs = positions.double()[:, None] @ inv_freq[None, :]
    return freqs.cos().to(dtype), freqs.sin().to(dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(x, cos, sin):
    cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)   # emb = cat((freqs, freqs))
    return (x * cos) + (rotate_half(x) * sin)


def rope_attention(q, k, v, cos, sin, attention_factor=1.0):
    cos, sin = cos.to(q.dtype) * attention_factor, sin.to(q.dtype) * attention_factor   # attention_scaling
    q, k = apply_rotary_pos_emb(q, cos, sin), apply_rotary_pos_emb(k, cos, sin)
    scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.shape[-1])
    T = q.shape[-2]
    causal = torch.triu(torch.full((T, T), float("-inf"), dtype=q.dtype, device=q.device), diagonal=1)
    attn_weights = F.softmax(scores + causal, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(attn_weights, v)
