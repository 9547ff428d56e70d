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
    raise NotImplementedError("write rope_inv_freq")


def linear_inv_freq(head_dim: int, base: float, factor: float) -> torch.Tensor:
    """Position Interpolation (Chen et al., 2023): every frequency divided by ``factor``, the same
    turn as dividing every position by it."""
    raise NotImplementedError("write linear_inv_freq")


def ntk_inv_freq(head_dim: int, base: float, factor: float) -> torch.Tensor:
    """NTK-aware scaling (bloc97, 2023): the base raised to ``base * factor^(head_dim/(head_dim-2))``,
    so pair 0 keeps its frequency and the last pair's is divided by exactly ``factor``."""
    raise NotImplementedError("write ntk_inv_freq")


def yarn_inv_freq(head_dim: int, base: float, factor: float, original_max_len: int,
                  beta_fast: float = 32.0, beta_slow: float = 1.0) -> torch.Tensor:
    """YaRN (Peng et al., 2023), as its authors' code and Hugging Face compute it: pairs that turn
    more than ``beta_fast`` times over the original context keep their frequency, pairs that turn
    less than ``beta_slow`` times have it divided by ``factor``, and a ramp, linear in the pair
    index, blends the two between (its ends rounded outwards to whole pairs)."""
    raise NotImplementedError("write yarn_inv_freq")


def yarn_attention_factor(factor: float) -> float:
    """YaRN's sqrt(1/t) = 0.1 ln(factor) + 1 (1.0 when nothing is stretched): q and k are each
    multiplied by it, so the logits by 1/t."""
    raise NotImplementedError("write yarn_attention_factor")


def llama3_inv_freq(head_dim: int, base: float, factor: float, original_max_len: int,
                    low_freq_factor: float = 1.0, high_freq_factor: float = 4.0) -> torch.Tensor:
    """Llama 3.1's frequencies: pairs whose wavelength is under ``original_max_len / high_freq_factor``
    keep theirs, pairs whose wavelength is over ``original_max_len / low_freq_factor`` have theirs
    divided by ``factor``, and those between are blended by how many turns they make."""
    raise NotImplementedError("write llama3_inv_freq")


def scaled_rope(positions: torch.Tensor, head_dim: int, base: float = 10000.0, rope_scaling: dict | None = None,
                dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each ``(T, head_dim // 2)`` of ``dtype``, of the angles ``positions[t] * inv_freq[i]``
    where inv_freq is the method ``rope_scaling["rope_type"]`` names ("default", "linear", "ntk",
    "yarn" or "llama3"; None is "default"), with Hugging Face's keys for its parameters. The legacy
    key ``"type"`` names the method too (``rope_type`` wins when both are given).
    Raises ValueError for another rope_type, and for a dict that names no method."""
    raise NotImplementedError("write scaled_rope")


def rope_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   attention_factor: float = 1.0) -> torch.Tensor:
    """Causal attention of q, k, v ``(B, H, T, head_dim)`` with q and k rotated by ``cos``, ``sin``
    ``(T, head_dim // 2)`` (row t: token t's angles) and multiplied by ``attention_factor`` each,
    so the logits ``q·k / sqrt(head_dim)`` are multiplied by its square. Returns ``(B, H, T, head_dim)``
    in q's dtype."""
    raise NotImplementedError("write rope_attention")
