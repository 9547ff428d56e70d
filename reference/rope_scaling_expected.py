"""The rope-scaling grader's expected values, written apart from the reference, the way the papers
and the widely used code compute them, in float64: YaRN as its authors' repository and Hugging
Face's ``_compute_yarn_parameters`` do (find_correction_range, linear_ramp_factor), Llama 3.1 as
Meta's ``apply_scaling`` does (a loop over the frequencies), Position Interpolation as the paper
writes it (positions divided), and attention by F.scaled_dot_product_attention on q and k rotated
as complex numbers.

They are answers as much as the reference is, so they stay out of student bundles with it: the
grader asks for them as ``bugs.expected``, which a bundle replays from its recordings.
"""
import math

import torch
import torch.nn.functional as F


def pos_freqs(dim, base):
    """base^(2i/dim) for i = 0 .. dim/2 - 1: the wavelengths over 2 pi, Hugging Face's name."""
    return base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def default(dim, base):
    return 1.0 / pos_freqs(dim, base)


def ntk(dim, base, factor):
    """bloc97's NTK-aware base: base * alpha^(dim / (dim - 2))."""
    return 1.0 / pos_freqs(dim, base * factor ** (dim / (dim - 2)))


def find_correction_dim(num_rotations, dim, base, max_position_embeddings):
    return (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def find_correction_range(low_rot, high_rot, dim, base, max_position_embeddings):
    low = math.floor(find_correction_dim(low_rot, dim, base, max_position_embeddings))
    high = math.ceil(find_correction_dim(high_rot, dim, base, max_position_embeddings))
    return max(low, 0), min(high, dim - 1)


def linear_ramp_factor(min, max, dim):
    if min == max:
        max += 0.001
    return torch.clamp((torch.arange(dim, dtype=torch.float64) - min) / (max - min), 0, 1)


def yarn(dim, base, factor, original_max_position_embeddings, beta_fast=32.0, beta_slow=1.0):
    """Hugging Face's _compute_yarn_parameters (truncate=True), in float64."""
    inv_freq_extrapolation = 1.0 / pos_freqs(dim, base)
    inv_freq_interpolation = 1.0 / (factor * pos_freqs(dim, base))
    low, high = find_correction_range(beta_fast, beta_slow, dim, base, original_max_position_embeddings)
    inv_freq_extrapolation_factor = 1 - linear_ramp_factor(low, high, dim // 2)
    return (inv_freq_interpolation * (1 - inv_freq_extrapolation_factor)
            + inv_freq_extrapolation * inv_freq_extrapolation_factor)


def get_mscale(scale):
    """YaRN's sqrt(1/t) = 0.1 ln(s) + 1, 1 for s <= 1 (Hugging Face's get_mscale with mscale = 1)."""
    if scale <= 1:
        return 1.0
    return 0.1 * math.log(scale) + 1.0


def apply_scaling(dim, base, scale_factor, old_context_len, low_freq_factor=1.0, high_freq_factor=4.0):
    """Meta's llama-models apply_scaling, one frequency at a time."""
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    new_freqs = []
    for freq in default(dim, base).tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            new_freqs.append(freq)
        elif wavelen > low_freq_wavelen:
            new_freqs.append(freq / scale_factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            new_freqs.append((1 - smooth) * freq / scale_factor + smooth * freq)
    return torch.tensor(new_freqs, dtype=torch.float64)


def method(rope_scaling):
    """The method a rope_scaling dict names, as Hugging Face reads it: rope_type, else the legacy key type."""
    s = rope_scaling or {"rope_type": "default"}
    return s.get("rope_type", s.get("type"))


def inv_freq(dim, base, rope_scaling):
    """The frequencies a rope_scaling dict names, by the functions above. Position Interpolation
    is not among them: the paper divides positions (see ``cos_sin``)."""
    s = rope_scaling or {"rope_type": "default"}
    kind = method(rope_scaling)
    if kind in ("default", "linear"):
        return default(dim, base)
    if kind == "ntk":
        return ntk(dim, base, s["factor"])
    if kind == "yarn":
        return yarn(dim, base, s["factor"], s["original_max_position_embeddings"], s.get("beta_fast", 32.0),
                    s.get("beta_slow", 1.0))
    return apply_scaling(dim, base, s["factor"], s["original_max_position_embeddings"],
                         s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0))


def cos_sin(positions, dim, base, rope_scaling, dtype):
    """(cos, sin) (T, dim/2) in dtype: Position Interpolation as Chen et al. write it, f(x, m·L/L'),
    the positions divided by the factor; the other methods by their frequencies."""
    s = rope_scaling or {"rope_type": "default"}
    m = positions.double() / (s["factor"] if method(rope_scaling) == "linear" else 1.0)   # (T,)
    angle = torch.outer(m, inv_freq(dim, base, rope_scaling))   # (T, dim/2)
    return angle.cos().to(dtype), angle.sin().to(dtype)


def rotate_complex(t, cos, sin):
    """Pair (t[2i], t[2i+1]) as the complex number t[2i] + j·t[2i+1], times cos + j·sin."""
    hd = t.shape[-1]
    z = torch.view_as_complex(t.double().reshape(*t.shape[:-1], hd // 2, 2).contiguous())   # (..., T, hd/2)
    return torch.view_as_real(z * torch.complex(cos.double(), sin.double())).flatten(-2)   # (..., T, hd)


def attention(q, k, v, cos, sin, attention_factor):
    """YaRN's softmax(q_m·k_n / (t·sqrt(d))) with sqrt(1/t) = attention_factor: SDPA's scale argument
    carries 1/(t·sqrt(d)). Causal; in q's dtype."""
    scale = attention_factor ** 2 / math.sqrt(q.shape[-1])
    out = F.scaled_dot_product_attention(rotate_complex(q, cos, sin), rotate_complex(k, cos, sin), v.double(),
                                         is_causal=True, scale=scale)
    return out.to(q.dtype)
