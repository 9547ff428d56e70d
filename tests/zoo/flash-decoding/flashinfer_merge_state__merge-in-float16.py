"""FlashInfer's cascade merge, with the chunk kernel run in the activations' dtype: float16
inputs give float16 partials, whose lse near 100 keeps only 0.06, merged as they are."""
import functools
import math

import torch


def partial_attention(q, k_chunk, v_chunk):
    q32, k32, v32 = q, k_chunk, v_chunk   # kept in q's dtype: float16 in, float16 partials out
    if q.shape[1] % k_chunk.shape[1] != 0:   # num_qo_heads must be a multiple of num_kv_heads
        raise ValueError(f"num_qo_heads {q.shape[1]} is not a multiple of num_kv_heads {k_chunk.shape[1]}")
    if k_chunk.shape[-2] == 0:
        return torch.zeros_like(q32), torch.full(q32.shape[:-1], -math.inf, dtype=q32.dtype, device=q.device)
    s = torch.einsum("bgrqd,bgkd->bgrqk", q32.unflatten(1, (k32.shape[1], -1)), k32) * q.shape[-1] ** -0.5
    s_max = s.max(dim=-1, keepdim=True).values
    p = torch.exp(s - s_max)
    d = p.sum(dim=-1, keepdim=True)
    v = torch.einsum("bgrqk,bgkd->bgrqd", p, v32) / d
    return v.flatten(1, 2), (s_max + torch.log(d)).squeeze(-1).flatten(1, 2)


def merge_state(v_a, s_a, v_b, s_b):
    s_max = torch.maximum(s_a, s_b)
    s_max = torch.where(torch.isinf(s_max), torch.zeros_like(s_max), s_max)   # both empty: no -inf - -inf
    a, b = torch.exp(s_a - s_max), torch.exp(s_b - s_max)
    v = (v_a * a[..., None] + v_b * b[..., None]) / (a + b)[..., None].clamp_min(1e-30)
    return v, s_max + torch.log(a + b)


def merge_partials(outs, lses):
    dtype = torch.promote_types(outs[0].dtype, torch.float32)
    states = [(v.to(dtype), s.to(dtype)) for v, s in zip(outs, lses)]
    return functools.reduce(lambda x, y: merge_state(*x, *y), states)


def split_kv_decode(q, k, v, n_splits):
    if n_splits < 1:
        raise ValueError(f"n_splits must be >= 1, got {n_splits}")
    kv_len = k.shape[-2]
    if kv_len == 0:
        raise ValueError("empty KV cache")
    chunk_size = -(-kv_len // n_splits)
    states = [partial_attention(q, k[..., i * chunk_size:(i + 1) * chunk_size, :],
                                v[..., i * chunk_size:(i + 1) * chunk_size, :]) for i in range(n_splits)]
    out, _ = merge_partials([s[0] for s in states], [s[1] for s in states])
    return out.to(q.dtype)
