"""Reference of the kv-quant kata: a KV cache stored in int8 or float8 (e4m3), one byte an element.

Symmetric absmax quantization: q = x / scale, rounded and clamped to the 8-bit range, with one
float32 scale per slice. Keys get a scale per channel and values a scale per token, as KIVI does
(Liu et al. 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache"): a few key
channels carry outliers far larger than the rest, while values have no such channels and their
errors mix through the attention weights. The attention dequantizes and accumulates in float32.
"""
import math

import torch
import torch.nn.functional as F

# The largest magnitude each 8-bit type stores: int8 is kept symmetric (-128 is never used, so
# that q and -q both exist), float8 e4m3fn's largest finite value is 448.
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}


def quantize(x: torch.Tensor, dtype: torch.dtype, axis: int = -1,
             scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize x to ``dtype`` (torch.int8 or torch.float8_e4m3fn), symmetrically.

    Without ``scale``, one scale per slice along ``axis``: scale = absmax / 127 (int8) or
    absmax / 448 (e4m3), absmax the largest |x| of the slice, reduced over ``axis`` and kept with
    size 1 there; an all-zero slice gets scale 1.0 (any positive scale keeps its zeros). With
    ``scale`` (a static scale, broadcastable to x), that scale is used and returned. x / scale is
    clamped to [-127, 127] (int8, then rounded to the nearest integer) or [-448, 448] (e4m3)
    before the cast: values past the range saturate. Returns (q, scale): q of x's shape in ``dtype``, scale float32.
    """
    qmax = QMAX[dtype]
    x = x.float()
    if scale is None:
        absmax = x.abs().amax(dim=axis, keepdim=True)   # x's shape, size 1 along axis
        # an all-zero slice would divide 0 by 0: any positive scale stores its zeros exactly.
        scale = torch.where(absmax > 0, absmax / qmax, torch.ones_like(absmax))
    scale = scale.float()
    # clamp before the cast: int8 wraps around past 127 (200 becomes -56).
    y = (x / scale).clamp(-qmax, qmax)   # x's shape, in [-qmax, qmax]
    if dtype == torch.int8:
        y = y.round()   # the cast to int8 truncates towards zero: round to the nearest first
    return y.to(dtype), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 values q stands for: q * scale (scale broadcast to q's shape)."""
    return q.float() * scale


class QuantKVCache:
    """A KV cache that stores keys and values in 8 bits: one byte an element, and float32 scales.

    ``QuantKVCache(dtype)``, dtype torch.int8 (the default) or torch.float8_e4m3fn.
    ``append(k, v)`` quantizes the keys and values of new tokens, (B, H, T, d) each: the keys with
    a scale per channel over the chunk's tokens, (B, H, 1, d), the values with a scale per token,
    (B, H, T, 1). ``attend(q)`` is causal attention of the last Tq cached tokens' queries over
    every cached token, dequantized and computed in float32.
    """

    def __init__(self, dtype: torch.dtype = torch.int8):
        """An empty cache that will store its keys and values in ``dtype``."""
        self.dtype = dtype
        # one entry per append: each chunk of keys has its own per-channel scales.
        self.k, self.k_scale, self.v, self.v_scale = [], [], [], []

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize and store the keys and values of T new tokens, (B, H, T, d) each."""
        kq, ks = quantize(k, self.dtype, axis=-2)   # (B, H, T, d), (B, H, 1, d): a scale per channel
        vq, vs = quantize(v, self.dtype, axis=-1)   # (B, H, T, d), (B, H, T, 1): a scale per token
        self.k.append(kq)
        self.k_scale.append(ks)
        self.v.append(vq)
        self.v_scale.append(vs)

    def attend(self, q: torch.Tensor) -> torch.Tensor:
        """q (B, H, Tq, d), the queries of the last Tq cached tokens -> (B, H, Tq, d) float32.

        Query i sits at position Tk - Tq + i and sees keys 0 .. Tk - Tq + i (the causal mask
        aligned bottom-right); Tq == 1 is a decoding step, which sees every cached token.
        """
        # dequantized in float32 for this call only: the cache keeps its 8-bit codes.
        k = torch.cat([dequantize(kq, ks) for kq, ks in zip(self.k, self.k_scale)], dim=2)   # (B, H, Tk, d)
        v = torch.cat([dequantize(vq, vs) for vq, vs in zip(self.v, self.v_scale)], dim=2)   # (B, H, Tk, d)
        q = q.float()
        Tq, Tk = q.shape[2], k.shape[2]
        # scores and softmax in float32: float16 sums of d products lose ~3 digits.
        att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])   # (B, H, Tq, Tk)
        allowed = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq)   # (Tq, Tk), True = may attend
        att = att.masked_fill(~allowed, float("-inf"))
        att = F.softmax(att, dim=-1)   # each query's row is a distribution over the keys
        return att @ v   # (B, H, Tq, d)
