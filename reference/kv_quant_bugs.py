"""Known kv-quant bugs, each a complete reference with exactly that mistake."""
import math

import torch
import torch.nn.functional as F

from reference.kv_quant import QMAX, QuantKVCache, dequantize, quantize


def quantize_last_axis(x, dtype, axis=-1, scale=None):
    """The scale is always taken over the last axis, whatever ``axis`` asks: keys get a scale per
    token, as if they were values."""
    qmax = QMAX[dtype]
    x = x.float()
    if scale is None:
        absmax = x.abs().amax(dim=-1, keepdim=True)   # ignores axis
        scale = torch.where(absmax > 0, absmax / qmax, torch.ones_like(absmax))
    scale = scale.float()
    y = (x / scale).clamp(-qmax, qmax)
    if dtype == torch.int8:
        y = y.round()
    return y.to(dtype), scale


class KeysPerTokenCache(QuantKVCache):
    """Keys quantized with a scale per token, like the values: an outlier channel sets every
    token's scale, and the other channels keep a few levels each."""

    def append(self, k, v):
        kq, ks = quantize(k, self.dtype, axis=-1)   # per token: the wrong axis for keys
        vq, vs = quantize(v, self.dtype, axis=-1)
        self.k.append(kq)
        self.k_scale.append(ks)
        self.v.append(vq)
        self.v_scale.append(vs)


class ValuesPerChannelCache(QuantKVCache):
    """Values quantized with a scale per channel over the chunk's tokens: one large token sets the
    scale of every channel, and the other tokens' values lose their precision."""

    def append(self, k, v):
        kq, ks = quantize(k, self.dtype, axis=-2)
        vq, vs = quantize(v, self.dtype, axis=-2)   # per channel: the wrong axis for values
        self.k.append(kq)
        self.k_scale.append(ks)
        self.v.append(vq)
        self.v_scale.append(vs)


def quantize_truncates(x, dtype, axis=-1, scale=None):
    """``.to(torch.int8)`` without rounding first: the cast truncates towards zero, an error of up
    to a whole step, biased towards 0."""
    qmax = QMAX[dtype]
    x = x.float()
    if scale is None:
        absmax = x.abs().amax(dim=axis, keepdim=True)
        scale = torch.where(absmax > 0, absmax / qmax, torch.ones_like(absmax))
    scale = scale.float()
    y = (x / scale).clamp(-qmax, qmax)
    return y.to(dtype), scale   # no round(): int8 truncates


def quantize_no_clamp(x, dtype, axis=-1, scale=None):
    """No clamp before the cast: a static scale lets x / scale pass 127, and int8 wraps around."""
    qmax = QMAX[dtype]
    x = x.float()
    if scale is None:
        absmax = x.abs().amax(dim=axis, keepdim=True)
        scale = torch.where(absmax > 0, absmax / qmax, torch.ones_like(absmax))
    scale = scale.float()
    y = x / scale   # not clamped
    if dtype == torch.int8:
        y = y.round()
    return y.to(dtype), scale


def quantize_clamps_after_cast(x, dtype, axis=-1, scale=None):
    """The clamp comes after the cast: int8 has already wrapped 200 to -56, inside the range."""
    qmax = QMAX[dtype]
    x = x.float()
    if scale is None:
        absmax = x.abs().amax(dim=axis, keepdim=True)
        scale = torch.where(absmax > 0, absmax / qmax, torch.ones_like(absmax))
    scale = scale.float()
    y = x / scale
    if dtype == torch.int8:
        return y.round().to(dtype).clamp(-127, 127), scale   # too late: the cast wrapped first
    return y.to(dtype), scale


def quantize_zero_scale(x, dtype, axis=-1, scale=None):
    """scale = absmax / qmax with no guard: an all-zero slice gets scale 0, and 0 / 0 is NaN."""
    qmax = QMAX[dtype]
    x = x.float()
    if scale is None:
        scale = x.abs().amax(dim=axis, keepdim=True) / qmax   # 0 for an all-zero slice
    scale = scale.float()
    y = (x / scale).clamp(-qmax, qmax)
    if dtype == torch.int8:
        y = y.round()
    return y.to(dtype), scale


class CacheWith(QuantKVCache):
    """The reference's cache, quantizing with ``quantize_with``: a learner's cache calls their own
    quantize, mistake and all."""

    quantize_with = staticmethod(quantize)

    def append(self, k, v):
        kq, ks = self.quantize_with(k, self.dtype, axis=-2)
        vq, vs = self.quantize_with(v, self.dtype, axis=-1)
        self.k.append(kq)
        self.k_scale.append(ks)
        self.v.append(vq)
        self.v_scale.append(vs)


class LastAxisCache(CacheWith):
    quantize_with = staticmethod(quantize_last_axis)


class TruncatingCache(CacheWith):
    quantize_with = staticmethod(quantize_truncates)


class NoClampCache(CacheWith):
    quantize_with = staticmethod(quantize_no_clamp)


class ClampAfterCastCache(CacheWith):
    quantize_with = staticmethod(quantize_clamps_after_cast)


class ZeroScaleCache(CacheWith):
    quantize_with = staticmethod(quantize_zero_scale)


class LowPrecisionCache(QuantKVCache):
    """attend with the dequantized cache, the scores and the softmax in ``low`` (float16 or
    bfloat16), cast to float32 at the end: 11 or 8 significant bits."""

    low = torch.float16

    def attend(self, q):
        k = torch.cat([dequantize(kq, ks) for kq, ks in zip(self.k, self.k_scale)], dim=2).to(self.low)
        v = torch.cat([dequantize(vq, vs) for vq, vs in zip(self.v, self.v_scale)], dim=2).to(self.low)
        q = q.to(self.low)
        Tq, Tk = q.shape[2], k.shape[2]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        allowed = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq)
        att = att.masked_fill(~allowed, float("-inf"))
        att = F.softmax(att, dim=-1)
        return (att @ v).float()


class BFloat16Cache(LowPrecisionCache):
    low = torch.bfloat16


def attention(cache, q, scale=None, softmax_dim=-1, top_left=False):
    """The reference's attend, with one of the shared mistakes switched on."""
    k = torch.cat([dequantize(kq, ks) for kq, ks in zip(cache.k, cache.k_scale)], dim=2)
    v = torch.cat([dequantize(vq, vs) for vq, vs in zip(cache.v, cache.v_scale)], dim=2)
    q = q.float()
    Tq, Tk = q.shape[2], k.shape[2]
    att = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    allowed = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(0 if top_left else Tk - Tq)
    att = att.masked_fill(~allowed, float("-inf"))
    att = F.softmax(att, dim=softmax_dim)
    return att @ v


class UnscaledCache(QuantKVCache):
    def attend(self, q):
        return attention(self, q, scale=1.0)   # q·k never divided by sqrt(d)


class DoubleScaledCache(QuantKVCache):
    def attend(self, q):
        return attention(self, q, scale=1 / q.shape[-1])   # 1/d: q and the scores both scaled by 1/sqrt(d)


class SoftmaxOverQueriesCache(QuantKVCache):
    def attend(self, q):
        return attention(self, q, softmax_dim=-2)   # normalised over the queries, not the keys


class TopLeftCache(QuantKVCache):
    def attend(self, q):
        return attention(self, q, top_left=True)   # tril(0): query i sees keys 0 .. i


class FloatCopyCache(QuantKVCache):
    """Quantizes and dequantizes at once and keeps the float32 result ("fake quantization"): the
    answers are the quantized cache's, the memory four bytes an element."""

    def append(self, k, v):
        kq, ks = quantize(k, self.dtype, axis=-2)
        vq, vs = quantize(v, self.dtype, axis=-1)
        self.k.append(dequantize(kq, ks))   # float32: 4 bytes an element
        self.k_scale.append(torch.ones(()))
        self.v.append(dequantize(vq, vs))
        self.v_scale.append(torch.ones(()))


BUGS = {
    "scale-wrong-axis": [{"quantize": quantize_last_axis, "QuantKVCache": LastAxisCache},
                         {"QuantKVCache": KeysPerTokenCache}, {"QuantKVCache": ValuesPerChannelCache}],
    "truncates-not-rounds": {"quantize": quantize_truncates, "QuantKVCache": TruncatingCache},
    "not-saturated": [{"quantize": quantize_no_clamp, "QuantKVCache": NoClampCache},
                      {"quantize": quantize_clamps_after_cast, "QuantKVCache": ClampAfterCastCache}],
    "zero-scale": {"quantize": quantize_zero_scale, "QuantKVCache": ZeroScaleCache},
    "low-precision-accumulate": [{"QuantKVCache": LowPrecisionCache}, {"QuantKVCache": BFloat16Cache}],
    "no-scaling": {"QuantKVCache": UnscaledCache},
    "double-scale": {"QuantKVCache": DoubleScaledCache},
    "softmax-wrong-dim": {"QuantKVCache": SoftmaxOverQueriesCache},
    "mask-top-left-aligned": {"QuantKVCache": TopLeftCache},
    "keeps-float-copy": {"QuantKVCache": FloatCopyCache},
}
