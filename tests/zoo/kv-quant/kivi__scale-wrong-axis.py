"""KIVI's torch path (jy-yuan/KIVI, quant/new_pack.py), made symmetric and 8-bit: keys quantized
along the tokens (a scale per channel), values along the channels (a scale per token), in place."""
import math

import torch
import torch.nn.functional as F

MAX_INT = {torch.int8: 127, torch.float8_e4m3fn: 448}


def quantize(x, dtype, axis=-1, scale=None):
    max_int = MAX_INT[dtype]
    data = x.float().clone()
    if scale is None:
        mx = torch.amax(data.abs(), dim=axis, keepdim=True)
        scale = mx / max_int
        scale[mx == 0] = 1.0
    scale = scale.float()
    data.div_(scale)
    data = data.clamp_(-max_int, max_int)
    if dtype == torch.int8:
        data = data.round_()
    return data.to(dtype), scale


def dequantize(q, scale):
    return q.to(torch.float32) * scale


class QuantKVCache:
    def __init__(self, dtype=torch.int8):
        self.dtype = dtype
        self.key_states_quant, self.key_scale = [], []
        self.value_states_quant, self.value_scale = [], []

    def append(self, k, v):
        key_quant, key_scale = quantize(k, self.dtype, axis=3)
        value_quant, value_scale = quantize(v, self.dtype, axis=3)
        self.key_states_quant.append(key_quant)
        self.key_scale.append(key_scale)
        self.value_states_quant.append(value_quant)
        self.value_scale.append(value_scale)

    def attend(self, q):
        key_states = torch.cat([dequantize(c, s) for c, s in zip(self.key_states_quant, self.key_scale)], dim=2)
        value_states = torch.cat([dequantize(c, s) for c, s in zip(self.value_states_quant, self.value_scale)], dim=2)
        query_states = q.float()
        q_len, kv_len = query_states.shape[2], key_states.shape[2]
        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(query_states.shape[-1])
        causal = torch.full((q_len, kv_len), float("-inf"), device=q.device).triu(kv_len - q_len + 1)
        attn_weights = F.softmax(attn_weights + causal, dim=-1, dtype=torch.float32)
        return torch.matmul(attn_weights, value_states)
