import math

import torch
import torch.nn.functional as F


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
    raise NotImplementedError("write quantize")


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 values q stands for: q * scale (scale broadcast to q's shape)."""
    raise NotImplementedError("write dequantize")


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
        raise NotImplementedError("write QuantKVCache.__init__")

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize and store the keys and values of T new tokens, (B, H, T, d) each."""
        raise NotImplementedError("write QuantKVCache.append")

    def attend(self, q: torch.Tensor) -> torch.Tensor:
        """q (B, H, Tq, d), the queries of the last Tq cached tokens -> (B, H, Tq, d) float32.

        Query i sits at position Tk - Tq + i and sees keys 0 .. Tk - Tq + i (the causal mask
        aligned bottom-right); Tq == 1 is a decoding step, which sees every cached token.
        """
        raise NotImplementedError("write QuantKVCache.attend")
