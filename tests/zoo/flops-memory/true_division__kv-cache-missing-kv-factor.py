"""Formulas with `/`, and a KV cache that holds one tensor per layer: the keys, without the values."""
import math


def attention_params(d_model, n_heads, n_kv_heads=None, bias=False):
    kv_dim = (n_kv_heads if n_kv_heads is not None else n_heads) * d_model / n_heads
    return 2 * d_model * d_model + 2 * d_model * kv_dim + (2 * d_model + 2 * kv_dim if bias else 0)


def attention_flops(batch, seq_len, d_model, n_heads, n_kv_heads=None):
    kv_dim = (n_kv_heads if n_kv_heads is not None else n_heads) * d_model / n_heads
    return 2 * batch * seq_len * d_model * (2 * d_model + 2 * kv_dim) + 4 * batch * seq_len**2 * d_model


def attention_scores_bytes(batch, n_heads, seq_len, bytes_per_element=4):
    return batch * n_heads * seq_len * seq_len * bytes_per_element


def kv_cache_bytes(batch, seq_len, n_layers, n_kv_heads, head_dim, bytes_per_element=2):
    return n_layers * batch * n_kv_heads * seq_len * head_dim * bytes_per_element


def max_seq_len(memory_bytes, batch, n_heads, bytes_per_element=2):
    return int(math.sqrt(memory_bytes / (batch * n_heads * bytes_per_element)))
