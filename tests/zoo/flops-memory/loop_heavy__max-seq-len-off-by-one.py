"""Loop-heavy max_seq_len that counts up while the scores fit and returns where the loop stopped:
the first T that does NOT fit."""
import math


def attention_params(d_model, n_heads, n_kv_heads=None, bias=False):
    kv_dim = (n_kv_heads or n_heads) * (d_model // n_heads)
    return 2 * d_model * (d_model + kv_dim) + (2 * (d_model + kv_dim) if bias else 0)


def attention_flops(batch, seq_len, d_model, n_heads, n_kv_heads=None):
    return 2 * batch * seq_len * attention_params(d_model, n_heads, n_kv_heads) + 4 * batch * seq_len**2 * d_model


def attention_scores_bytes(batch, n_heads, seq_len, bytes_per_element=4):
    return batch * n_heads * seq_len**2 * bytes_per_element


def kv_cache_bytes(batch, seq_len, n_layers, n_kv_heads, head_dim, bytes_per_element=2):
    return 2 * bytes_per_element * n_layers * n_kv_heads * head_dim * batch * seq_len


def max_seq_len(memory_bytes, batch, n_heads, bytes_per_element=2):
    T = math.isqrt(memory_bytes // (batch * n_heads * bytes_per_element)) - 2   # start close, then walk
    while batch * n_heads * T * T * bytes_per_element <= memory_bytes:
        T += 1
    return T
