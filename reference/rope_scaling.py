"""RoPE past the training length: Position Interpolation, NTK-aware scaling, YaRN and Llama 3.1.

Each method changes the inverse frequencies theta_i = base^(-2i/head_dim) of the head_dim/2 pairs
(pair i is ``(x[2i], x[2i+1])``, as in the rope kata); YaRN also sharpens the softmax with a
temperature. Frequencies are float64 tensors ``(head_dim // 2,)``.
"""
import math

import torch
import torch.nn.functional as F


def rope_inv_freq(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """RoPE's own frequencies, ``theta_i = base^(-2i/head_dim)``: float64 ``(head_dim // 2,)``."""
    if head_dim % 2:
        raise ValueError(f"head_dim ({head_dim}) must be even: RoPE turns pairs of dimensions")
    return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)   # (hd/2,)


def linear_inv_freq(head_dim: int, base: float, factor: float) -> torch.Tensor:
    """Position Interpolation (Chen et al., 2023): every frequency divided by ``factor``, the same
    turn as dividing every position by it."""
    return rope_inv_freq(head_dim, base) / factor   # (hd/2,)


def ntk_inv_freq(head_dim: int, base: float, factor: float) -> torch.Tensor:
    """NTK-aware scaling (bloc97, 2023): the base raised to ``base * factor^(head_dim/(head_dim-2))``,
    so pair 0 keeps its frequency and the last pair's is divided by exactly ``factor``."""
    return rope_inv_freq(head_dim, base * factor ** (head_dim / (head_dim - 2)))   # (hd/2,)


def yarn_inv_freq(head_dim: int, base: float, factor: float, original_max_len: int,
                  beta_fast: float = 32.0, beta_slow: float = 1.0) -> torch.Tensor:
    """YaRN (Peng et al., 2023), as its authors' code and Hugging Face compute it: pairs that turn
    more than ``beta_fast`` times over the original context keep their frequency, pairs that turn
    less than ``beta_slow`` times have it divided by ``factor``, and a ramp, linear in the pair
    index, blends the two between (its ends rounded outwards to whole pairs)."""
    theta = rope_inv_freq(head_dim, base)   # (hd/2,)

    def pair_turning(turns):
        # The (fractional) pair index whose frequency makes `turns` full turns over the original
        # context: original_max_len * base^(-2i/hd) = 2 pi turns, solved for i.
        return head_dim * math.log(original_max_len / (2 * math.pi * turns)) / (2 * math.log(base))

    low = max(math.floor(pair_turning(beta_fast)), 0)   # pairs up to here: fast, left alone
    # pairs from here: slow, interpolated (clamped to head_dim - 1, not the last pair, as YaRN's code does)
    high = min(math.ceil(pair_turning(beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001   # a ramp of one pair: keep the division finite
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)   # (hd/2,)
    return theta * (1 - ramp) + theta / factor * ramp   # (hd/2,): 0 keeps theta, 1 divides it by factor


def yarn_attention_factor(factor: float) -> float:
    """YaRN's sqrt(1/t) = 0.1 ln(factor) + 1 (1.0 when nothing is stretched): q and k are each
    multiplied by it, so the logits by 1/t."""
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


def llama3_inv_freq(head_dim: int, base: float, factor: float, original_max_len: int,
                    low_freq_factor: float = 1.0, high_freq_factor: float = 4.0) -> torch.Tensor:
    """Llama 3.1's frequencies: pairs whose wavelength is under ``original_max_len / high_freq_factor``
    keep theirs, pairs whose wavelength is over ``original_max_len / low_freq_factor`` have theirs
    divided by ``factor``, and those between are blended by how many turns they make."""
    theta = rope_inv_freq(head_dim, base)   # (hd/2,)
    wavelength = 2 * math.pi / theta   # (hd/2,): positions per full turn
    # 0 for a pair that turns low_freq_factor times over the original context, 1 at high_freq_factor.
    smooth = (original_max_len / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)   # (hd/2,)
    blended = (1 - smooth) * theta / factor + smooth * theta   # (hd/2,)
    short = wavelength < original_max_len / high_freq_factor   # fast pairs: every angle seen in training
    long = wavelength > original_max_len / low_freq_factor   # slow pairs: never a full turn in training
    return torch.where(short, theta, torch.where(long, theta / factor, blended))   # (hd/2,)


def scaled_rope(positions: torch.Tensor, head_dim: int, base: float = 10000.0, rope_scaling: dict | None = None,
                dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each ``(T, head_dim // 2)`` of ``dtype``, of the angles ``positions[t] * inv_freq[i]``
    where inv_freq is the method ``rope_scaling["rope_type"]`` names ("default", "linear", "ntk",
    "yarn" or "llama3"; None is "default"), with Hugging Face's keys for its parameters. The legacy
    key ``"type"`` names the method too (``rope_type`` wins when both are given).
    Raises ValueError for another rope_type, and for a dict that names no method."""
    s = {"rope_type": "default"} if rope_scaling is None else rope_scaling
    # "type" is the key's name before Hugging Face renamed it rope_type: DeepSeek-V3's config and
    # Qwen2.5's YaRN instructions still write it, and Hugging Face reads it as rope_type.
    kind = s.get("rope_type", s.get("type"))
    if kind is None:
        raise ValueError(f"rope_scaling {s!r} names no method: give its rope_type (or the legacy key type)")
    if kind == "default":
        inv_freq = rope_inv_freq(head_dim, base)
    elif kind == "linear":
        inv_freq = linear_inv_freq(head_dim, base, s["factor"])
    elif kind == "ntk":
        inv_freq = ntk_inv_freq(head_dim, base, s["factor"])
    elif kind == "yarn":
        inv_freq = yarn_inv_freq(head_dim, base, s["factor"], s["original_max_position_embeddings"],
                                 s.get("beta_fast", 32.0), s.get("beta_slow", 1.0))
    elif kind == "llama3":
        inv_freq = llama3_inv_freq(head_dim, base, s["factor"], s["original_max_position_embeddings"],
                                   s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0))
    else:
        raise ValueError(f"unknown rope_type {kind!r}: expected default, linear, ntk, yarn or llama3")
    # The positions are not scaled: each method's scaling lives in its frequencies alone.
    angle = positions.to(torch.float64)[:, None] * inv_freq   # (T, hd/2), float64: rounded once below
    return angle.cos().to(dtype), angle.sin().to(dtype)   # (T, hd/2) each


def _rotate(x, cos, sin):
    x0, x1 = x[..., 0::2], x[..., 1::2]   # (B, H, T, hd/2) each
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)   # (B, H, T, hd)


def rope_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   attention_factor: float = 1.0) -> torch.Tensor:
    """Causal attention of q, k, v ``(B, H, T, head_dim)`` with q and k rotated by ``cos``, ``sin``
    ``(T, head_dim // 2)`` (row t: token t's angles) and multiplied by ``attention_factor`` each,
    so the logits ``q·k / sqrt(head_dim)`` are multiplied by its square. Returns ``(B, H, T, head_dim)``
    in q's dtype."""
    T, hd = q.shape[-2], q.shape[-1]
    c, s = cos.to(q.dtype), sin.to(q.dtype)   # (T, hd/2) each
    q, k = _rotate(q, c, s), _rotate(k, c, s)   # (B, H, T, hd) each
    # YaRN's temperature: sqrt(1/t) on q and on k is 1/t on the logits, never on v.
    att = (q @ k.transpose(-2, -1)) * (attention_factor ** 2 / math.sqrt(hd))   # (B, H, T, T)
    allowed = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()   # (T, T): True = may attend
    att = F.softmax(att.masked_fill(~allowed, float("-inf")), dim=-1)   # (B, H, T, T)
    return att @ v   # (B, H, T, hd)
