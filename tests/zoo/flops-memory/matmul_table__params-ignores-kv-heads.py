"""Matmul-table style that copies multi-head attention's four d_model x d_model projections,
whatever n_kv_heads is."""
from math import isqrt, prod


def attention_params(d_model, n_heads, n_kv_heads=None, bias=False):
    layers = [(d_model, d_model)] * 4   # W_q, W_k, W_v, W_o: (in, out)
    return sum(n_in * n_out + (n_out if bias else 0) for n_in, n_out in layers)


def attention_flops(batch, seq_len, d_model, n_heads, n_kv_heads=None):
    kv_dim = (n_kv_heads or n_heads) * (d_model // n_heads)
    bt, head_dim = batch * seq_len, d_model // n_heads
    matmuls = [(2, bt, d_model, d_model), (2, bt, d_model, kv_dim),
               (2 * batch * n_heads, seq_len, head_dim, seq_len)]
    return sum(count * 2 * m * k * n for count, m, k, n in matmuls)


def attention_scores_bytes(batch, n_heads, seq_len, bytes_per_element=4):
    return prod((batch, n_heads, seq_len, seq_len)) * bytes_per_element


def kv_cache_bytes(batch, seq_len, n_layers, n_kv_heads, head_dim, bytes_per_element=2):
    return 2 * n_layers * prod((batch, n_kv_heads, seq_len, head_dim)) * bytes_per_element


def max_seq_len(memory_bytes, batch, n_heads, bytes_per_element=2):
    return isqrt(memory_bytes // prod((batch, n_heads, bytes_per_element)))
