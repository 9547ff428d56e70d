"""Known rope-scaling bugs, each the reference with exactly that mistake."""
import math

import torch
import torch.nn.functional as F

from reference.rope_scaling import _rotate, rope_inv_freq, scaled_rope, yarn_inv_freq


def _scaled_rope_positions_too(positions, head_dim, base=10000.0, rope_scaling=None, dtype=torch.float32,
                               types=("linear",)):
    s = rope_scaling or {"rope_type": "default"}
    if s.get("rope_type", s.get("type")) in types:
        positions = positions.to(torch.float64) / s["factor"]   # the paper's m / s ...
    return scaled_rope(positions, head_dim, base, rope_scaling, dtype)   # ... on frequencies already divided


def scaled_rope_pi_positions_too(positions, head_dim, base=10000.0, rope_scaling=None, dtype=torch.float32):
    return _scaled_rope_positions_too(positions, head_dim, base, rope_scaling, dtype)


def scaled_rope_every_method_positions_too(positions, head_dim, base=10000.0, rope_scaling=None,
                                           dtype=torch.float32):
    return _scaled_rope_positions_too(positions, head_dim, base, rope_scaling, dtype,
                                      types=("linear", "ntk", "yarn", "llama3"))


def yarn_inv_freq_blend_reversed(head_dim, base, factor, original_max_len, beta_fast=32.0, beta_slow=1.0):
    theta = rope_inv_freq(head_dim, base)
    kept = yarn_inv_freq(head_dim, base, factor, original_max_len, beta_fast, beta_slow)
    ramp = (theta - kept) / (theta - theta / factor)   # 0 where YaRN keeps theta, 1 where it divides it
    return theta * ramp + theta / factor * (1 - ramp)   # the two ends of the blend swapped


def yarn_inv_freq_betas_swapped(head_dim, base, factor, original_max_len, beta_fast=32.0, beta_slow=1.0):
    # beta_slow's pair taken as the ramp's start and beta_fast's as its end: the ramp runs backwards.
    return yarn_inv_freq(head_dim, base, factor, original_max_len, beta_slow, beta_fast)


def rope_attention_temperature_on_values(q, k, v, cos, sin, attention_factor=1.0):
    T, hd = q.shape[-2], q.shape[-1]
    c, s = cos.to(q.dtype), sin.to(q.dtype)
    q, k = _rotate(q, c, s), _rotate(k, c, s)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
    allowed = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    att = F.softmax(att.masked_fill(~allowed, float("-inf")), dim=-1)
    return att @ (v * attention_factor)   # sqrt(1/t) on q, k and ... v instead of the logits


def rope_attention_temperature_on_output(q, k, v, cos, sin, attention_factor=1.0):
    T, hd = q.shape[-2], q.shape[-1]
    c, s = cos.to(q.dtype), sin.to(q.dtype)
    q, k = _rotate(q, c, s), _rotate(k, c, s)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
    allowed = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    att = F.softmax(att.masked_fill(~allowed, float("-inf")), dim=-1)
    return (att @ v) * attention_factor ** 2   # 1/t after the softmax: the values scaled, not the logits


def _rope_attention_logits_times(q, k, v, cos, sin, attention_factor, scale):
    """The reference's rope_attention with ``scale`` where it has 1/sqrt(head_dim)."""
    T = q.shape[-2]
    c, s = cos.to(q.dtype), sin.to(q.dtype)
    q, k = _rotate(q, c, s), _rotate(k, c, s)
    att = (q @ k.transpose(-2, -1)) * (attention_factor ** 2 * scale)
    allowed = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    att = F.softmax(att.masked_fill(~allowed, float("-inf")), dim=-1)
    return att @ v


def rope_attention_unscaled(q, k, v, cos, sin, attention_factor=1.0):
    return _rope_attention_logits_times(q, k, v, cos, sin, attention_factor, 1.0)   # the temperature alone


def rope_attention_scaled_twice(q, k, v, cos, sin, attention_factor=1.0):
    # 1/sqrt(head_dim) on q, and in the logits again
    return _rope_attention_logits_times(q, k, v, cos, sin, attention_factor, 1.0 / q.shape[-1])


def rope_attention_softmax_over_queries(q, k, v, cos, sin, attention_factor=1.0):
    T, hd = q.shape[-2], q.shape[-1]
    c, s = cos.to(q.dtype), sin.to(q.dtype)
    q, k = _rotate(q, c, s), _rotate(k, c, s)
    att = (q @ k.transpose(-2, -1)) * (attention_factor ** 2 / math.sqrt(hd))
    allowed = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    att = F.softmax(att.masked_fill(~allowed, float("-inf")), dim=-2)   # over the queries, not the keys
    return att @ v


def rope_attention_rotate_half(q, k, v, cos, sin, attention_factor=1.0):
    T, hd = q.shape[-2], q.shape[-1]
    # Hugging Face's rotate_half: pairs (x[i], x[i + hd/2]), each pair's angle repeated over both halves
    c, s = torch.cat([cos, cos], dim=-1).to(q.dtype), torch.cat([sin, sin], dim=-1).to(q.dtype)   # (T, hd)
    half = lambda x: torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], dim=-1)   # (B, H, T, hd)
    q, k = q * c + half(q) * s, k * c + half(k) * s
    att = (q @ k.transpose(-2, -1)) * (attention_factor ** 2 / math.sqrt(hd))
    allowed = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    att = F.softmax(att.masked_fill(~allowed, float("-inf")), dim=-1)
    return att @ v


def llama3_inv_freq_wavelengths_swapped(head_dim, base, factor, original_max_len, low_freq_factor=1.0,
                                        high_freq_factor=4.0):
    theta = rope_inv_freq(head_dim, base)
    wavelength = 2 * math.pi / theta
    low_freq_wavelen = original_max_len / high_freq_factor   # the two bounds' names swapped:
    high_freq_wavelen = original_max_len / low_freq_factor   # 2048 and 8192 for Llama 3.1
    smooth = (original_max_len / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * theta / factor + smooth * theta
    short = wavelength < high_freq_wavelen
    long = wavelength > low_freq_wavelen
    return torch.where(long, theta / factor, torch.where(short, theta, blended))


def llama3_inv_freq_loop_wavelengths_swapped(head_dim, base, factor, original_max_len, low_freq_factor=1.0,
                                             high_freq_factor=4.0):
    theta = rope_inv_freq(head_dim, base)
    wavelength = 2 * math.pi / theta
    # Meta's loop (`if wavelen < high_freq_wavelen: keep; elif wavelen > low_freq_wavelen: divide`)
    # with the two bounds' names swapped: kept under original / low_freq_factor, divided above it.
    return torch.where(wavelength < original_max_len / low_freq_factor, theta, theta / factor)


def llama3_inv_freq_factors_swapped(head_dim, base, factor, original_max_len, low_freq_factor=1.0,
                                    high_freq_factor=4.0):
    theta = rope_inv_freq(head_dim, base)
    wavelength = 2 * math.pi / theta
    # low_freq_factor and high_freq_factor swapped in the blend: it runs the wrong way between the bounds.
    smooth = (original_max_len / wavelength - high_freq_factor) / (low_freq_factor - high_freq_factor)
    blended = (1 - smooth) * theta / factor + smooth * theta
    short = wavelength < original_max_len / high_freq_factor
    long = wavelength > original_max_len / low_freq_factor
    return torch.where(short, theta, torch.where(long, theta / factor, blended))


BUGS = {
    "scale-on-positions-and-frequencies": [{"scaled_rope": scaled_rope_pi_positions_too},
                                           {"scaled_rope": scaled_rope_every_method_positions_too}],
    "yarn-ramp-reversed": [{"yarn_inv_freq": yarn_inv_freq_blend_reversed},
                           {"yarn_inv_freq": yarn_inv_freq_betas_swapped}],
    "temperature-on-values": [{"rope_attention": rope_attention_temperature_on_values},
                              {"rope_attention": rope_attention_temperature_on_output}],
    "rope-half-vs-interleaved": {"rope_attention": rope_attention_rotate_half},
    "no-scaling": {"rope_attention": rope_attention_unscaled},
    "double-scale": {"rope_attention": rope_attention_scaled_twice},
    "softmax-wrong-dim": {"rope_attention": rope_attention_softmax_over_queries},
    "llama3-bounds-swapped": [{"llama3_inv_freq": llama3_inv_freq_wavelengths_swapped},
                              {"llama3_inv_freq": llama3_inv_freq_loop_wavelengths_swapped},
                              {"llama3_inv_freq": llama3_inv_freq_factors_swapped}],
}
