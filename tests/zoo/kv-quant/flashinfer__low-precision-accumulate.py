"""FlashInfer's layout and names: the cache kept NHD (tokens, heads, head_dim) per batch entry,
sm_scale, and the attention written as one einsum over the whole ragged KV."""
import math

import torch


def quantize(x, dtype, axis=-1, scale=None):
    limit = 127.0 if dtype == torch.int8 else 448.0
    x = x.float()
    if scale is None:
        amax = x.abs().amax(dim=axis, keepdim=True)
        scale = torch.where(amax > 0, amax, torch.full_like(amax, limit)) / limit
    scale = scale.float()
    y = (x / scale).clamp(-limit, limit)
    return (y.round() if dtype == torch.int8 else y).to(dtype), scale


def dequantize(q, scale):
    return q.float() * scale


class QuantKVCache:
    def __init__(self, dtype=torch.int8):
        self.kv_dtype = dtype
        self.k_data, self.k_scale, self.v_data, self.v_scale = [], [], [], []   # NHD: (B, T, H, D)

    def append(self, k, v):
        kq, ks = quantize(k, self.kv_dtype, axis=2)   # (B, H, 1, D): a scale per channel
        vq, vs = quantize(v, self.kv_dtype, axis=3)   # (B, H, T, 1): a scale per token
        self.k_data.append(kq.transpose(1, 2))
        self.k_scale.append(ks.transpose(1, 2))
        self.v_data.append(vq.transpose(1, 2))
        self.v_scale.append(vs.transpose(1, 2))

    def attend(self, q):
        k = torch.cat([dequantize(d, s) for d, s in zip(self.k_data, self.k_scale)], dim=1)   # (B, Tk, H, D)
        v = torch.cat([dequantize(d, s) for d, s in zip(self.v_data, self.v_scale)], dim=1)
        qo_len, kv_len = q.shape[2], k.shape[1]
        sm_scale = 1.0 / math.sqrt(q.shape[-1])
        k, v = k.half(), v.half()   # half the bytes moved
        logits = torch.einsum("bhqd,bkhd->bhqk", q.half(), k) * sm_scale
        q_idx = torch.arange(qo_len, device=q.device)[:, None] + (kv_len - qo_len)
        kv_idx = torch.arange(kv_len, device=q.device)[None, :]
        logits = logits.masked_fill(kv_idx > q_idx, float("-inf"))
        return torch.einsum("bhqk,bkhd->bhqd", torch.softmax(logits, dim=-1), v).float()
