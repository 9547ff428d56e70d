"""vLLM's style: one quant op for static and dynamic scales (scaled_fp8_quant), the clamp to the
type's finfo before the cast, and a scale floor for dynamic scales (_FP8_MIN_SCALING_FACTOR)."""
import math

import torch


def _qrange(dtype):
    if dtype == torch.int8:
        return -127.0, 127.0
    info = torch.finfo(dtype)
    return info.min, info.max


def quantize(x, dtype, axis=-1, scale=None):
    qmin, qmax = _qrange(dtype)
    x = x.to(torch.float32)
    if scale is None:
        # dynamic: absmax over the axis, floored so that an all-zero slice never divides by zero
        scale = (x.abs().amax(dim=axis, keepdim=True) / qmax).clamp(min=1.0 / (qmax * 512.0))
    scale = scale.to(torch.float32)
    out = (x / scale).clamp(min=qmin, max=qmax)
    if dtype == torch.int8:
        out = out.round()
    return out.to(dtype), scale


def dequantize(q, scale):
    return q.to(torch.float32) * scale


class QuantKVCache:
    def __init__(self, dtype=torch.int8):
        self.kv_cache_dtype = dtype
        self.key_cache, self.value_cache = [], []   # (codes, scale) per append

    def append(self, k, v):
        self.key_cache.append(quantize(k, self.kv_cache_dtype, axis=-2))
        self.value_cache.append(quantize(v, self.kv_cache_dtype, axis=-1))

    def attend(self, q):
        key = torch.cat([dequantize(c, s) for c, s in self.key_cache], dim=-2)
        value = torch.cat([dequantize(c, s) for c, s in self.value_cache], dim=-2)
        query = q.to(torch.float32)
        num_queries, num_keys = query.shape[-2], key.shape[-2]
        attn = torch.einsum("bhqd,bhkd->bhqk", query, key) * (1.0 / math.sqrt(query.shape[-1]))
        pos_q = torch.arange(num_queries, device=q.device)
        pos_k = torch.arange(num_keys, device=q.device)
        attn = attn.masked_fill(pos_k[None, :] > pos_q[:, None], float("-inf"))
        attn = torch.softmax(attn, dim=-1)
        return torch.einsum("bhqk,bhkd->bhqd", attn, value)
