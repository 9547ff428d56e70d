"""Plain loops: every slice quantized on its own, and attention one query at a time."""
import math

import torch


def quantize(x, dtype, axis=-1, scale=None):
    top = 127.0 if dtype == torch.int8 else 448.0
    x = x.float()
    if scale is None:
        moved = x.movedim(axis, -1)
        rows = moved.reshape(-1, moved.shape[-1])
        scales = []
        for row in rows:
            m = float(row.abs().max())
            scales.append(m / top if m > 0 else 1.0)
        scale = torch.tensor(scales, dtype=torch.float32).reshape(moved.shape[:-1] + (1,)).movedim(-1, axis)
    scale = scale.float()
    y = torch.clamp(x / scale, -top, top)
    if dtype == torch.int8:
        y = torch.round(y)
    return y.to(dtype), scale


def dequantize(q, scale):
    return q.float() * scale


class QuantKVCache:
    def __init__(self, dtype=torch.int8):
        self.dtype = dtype
        self.chunks = []

    def append(self, k, v):
        self.chunks.append((quantize(k, self.dtype, axis=-2), quantize(v, self.dtype, axis=-1)))

    def attend(self, q):
        keys = torch.cat([dequantize(*kc) for kc, _ in self.chunks], dim=2)
        values = torch.cat([dequantize(*vc) for _, vc in self.chunks], dim=2)
        q = q.float()
        B, H, Tq, d = q.shape
        Tk = keys.shape[2]
        out = torch.zeros(B, H, Tq, d)
        for b in range(B):
            for h in range(H):
                for i in range(Tq):
                    last = Tk - Tq + i   # the last key query i may see
                    scores = keys[b, h, :last + 1] @ q[b, h, i] / math.sqrt(d)
                    weights = torch.softmax(scores, dim=0)
                    out[b, h, i] = weights @ values[b, h, :last + 1]
        return out
