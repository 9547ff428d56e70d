"""Hugging Face's QuantizedCache shape: axis_key and axis_value, _quantize / _dequantize methods,
lists of quantized tensors per update, and an eager attention with repeat-free heads."""
import math

import torch
from torch import nn


def quantize(x, dtype, axis=-1, scale=None):
    bound = 127.0 if dtype == torch.int8 else 448.0
    x = x.to(torch.float32)
    if scale is None:
        amax = x.abs().amax(dim=axis, keepdim=True)
        scale = amax / bound
    scale = scale.to(torch.float32)
    scaled = torch.clamp(x / scale, -bound, bound)
    if dtype == torch.int8:
        scaled = torch.round(scaled)
    return scaled.to(dtype), scale


def dequantize(q, scale):
    return q.to(torch.float32) * scale


class QuantKVCache:
    def __init__(self, dtype=torch.int8):
        self.nbits_dtype = dtype
        self.axis_key = -2
        self.axis_value = -1
        self._quantized_key_cache = []
        self._quantized_value_cache = []

    def _quantize(self, tensor, axis):
        return quantize(tensor, self.nbits_dtype, axis=axis)

    def _dequantize(self, qtensor):
        return dequantize(*qtensor)

    def append(self, k, v):
        self._quantized_key_cache.append(self._quantize(k.contiguous(), axis=self.axis_key))
        self._quantized_value_cache.append(self._quantize(v.contiguous(), axis=self.axis_value))

    def attend(self, q):
        key_states = torch.cat([self._dequantize(t) for t in self._quantized_key_cache], dim=-2)
        value_states = torch.cat([self._dequantize(t) for t in self._quantized_value_cache], dim=-2)
        query_states = q.to(torch.float32)
        q_len, kv_len = query_states.shape[-2], key_states.shape[-2]
        scaling = query_states.shape[-1] ** -0.5
        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) * scaling
        causal_mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device).tril(diagonal=kv_len - q_len)
        attn_weights = attn_weights.masked_fill(~causal_mask, torch.finfo(torch.float32).min)
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32)
        return torch.matmul(attn_weights, value_states)
