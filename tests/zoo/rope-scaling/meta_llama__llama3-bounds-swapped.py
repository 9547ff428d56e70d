"""Meta's llama-models apply_scaling with the two wavelength bounds' names exchanged
(low_freq_wavelen = old_context_len / high_freq_factor): in the loop, every wavelength under 8192
is kept and every one over it divided, with no band to blend."""
import math

import torch
import torch.nn.functional as F


def rope_inv_freq(head_dim, base=10000.0):
    if head_dim % 2 != 0:
        raise ValueError("head_dim must be even")
    return 1.0 / (base ** (torch.arange(0, head_dim, 2)[: (head_dim // 2)].double() / head_dim))


def linear_inv_freq(head_dim, base, factor):
    return rope_inv_freq(head_dim, base) / factor


def ntk_inv_freq(head_dim, base, factor):
    alpha = factor
    return rope_inv_freq(head_dim, base * alpha ** (head_dim / (head_dim - 2)))


def yarn_inv_freq(head_dim, base, factor, original_max_len, beta_fast=32.0, beta_slow=1.0):
    def correction_dim(num_rotations):
        return (head_dim * math.log(original_max_len / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001
    new_freqs = []
    for i, freq in enumerate(rope_inv_freq(head_dim, base).tolist()):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        new_freqs.append(freq * (1 - ramp) + freq / factor * ramp)
    return torch.tensor(new_freqs, dtype=torch.float64)


def yarn_attention_factor(factor):
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def llama3_inv_freq(head_dim, base, factor, original_max_len, low_freq_factor=1.0, high_freq_factor=4.0):
    scale_factor, old_context_len = factor, original_max_len
    low_freq_wavelen = old_context_len / high_freq_factor
    high_freq_wavelen = old_context_len / low_freq_factor
    new_freqs = []
    for freq in rope_inv_freq(head_dim, base).tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            new_freqs.append(freq)
        elif wavelen > low_freq_wavelen:
            new_freqs.append(freq / scale_factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            new_freqs.append((1 - smooth) * freq / scale_factor + smooth * freq)
    return torch.tensor(new_freqs, dtype=torch.float64)


def precompute_freqs_cis(positions, freqs):
    angles = torch.outer(positions.to(torch.float64), freqs)
    return torch.polar(torch.ones_like(angles), angles)   # complex128


def scaled_rope(positions, head_dim, base=10000.0, rope_scaling=None, dtype=torch.float32):
    cfg = rope_scaling if rope_scaling is not None else {"rope_type": "default"}
    t = cfg.get("rope_type", cfg.get("type"))
    if t == "default":
        freqs = rope_inv_freq(head_dim, base)
    elif t == "linear":
        freqs = linear_inv_freq(head_dim, base, cfg["factor"])
    elif t == "ntk":
        freqs = ntk_inv_freq(head_dim, base, cfg["factor"])
    elif t == "yarn":
        freqs = yarn_inv_freq(head_dim, base, cfg["factor"], cfg["original_max_position_embeddings"],
                              cfg.get("beta_fast", 32.0), cfg.get("beta_slow", 1.0))
    elif t == "llama3":
        freqs = llama3_inv_freq(head_dim, base, cfg["factor"], cfg["original_max_position_embeddings"],
                                cfg.get("low_freq_factor", 1.0), cfg.get("high_freq_factor", 4.0))
    else:
        raise ValueError(f"rope_type {t} is not supported")
    freqs_cis = precompute_freqs_cis(positions, freqs)
    return freqs_cis.real.to(dtype), freqs_cis.imag.to(dtype)


def apply_rotary_emb(x, freqs_cis):
    x_ = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_ * freqs_cis).flatten(3).type_as(x)


def rope_attention(q, k, v, cos, sin, attention_factor=1.0):
    freqs_cis = torch.complex(cos.double(), sin.double())
    xq, xk = apply_rotary_emb(q, freqs_cis), apply_rotary_emb(k, freqs_cis)
    seqlen, head_dim = q.shape[2], q.shape[3]
    scores = torch.matmul(xq, xk.transpose(2, 3)) / math.sqrt(head_dim)
    scores = scores * attention_factor ** 2
    mask = torch.triu(torch.full((seqlen, seqlen), float("-inf"), device=q.device), diagonal=1)
    scores = scores + mask.to(scores.dtype)
    scores = F.softmax(scores.float(), dim=-1).type_as(xq)
    return torch.matmul(scores, v)
