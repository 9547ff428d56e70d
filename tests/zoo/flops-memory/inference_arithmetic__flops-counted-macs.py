"""Back-of-the-envelope style counting multiply-adds (MACs), as hardware papers quote them: one
per parameter per token and one per matmul product, never the 2 FLOPs of a multiply-add."""
import math


def attention_params(d_model, n_heads, n_kv_heads=None, bias=False):
    kv_dim = (n_kv_heads or n_heads) * (d_model // n_heads)
    return 2 * d_model * (d_model + kv_dim) + (2 * (d_model + kv_dim) if bias else 0)


def attention_flops(batch, seq_len, d_model, n_heads, n_kv_heads=None):
    tokens = batch * seq_len
    return tokens * attention_params(d_model, n_heads, n_kv_heads) + 2 * batch * seq_len**2 * d_model


def attention_scores_bytes(batch, n_heads, seq_len, bytes_per_element=4):
    return batch * n_heads * seq_len**2 * bytes_per_element


def kv_cache_bytes(batch, seq_len, n_layers, n_kv_heads, head_dim, bytes_per_element=2):
    return 2 * bytes_per_element * n_layers * n_kv_heads * head_dim * batch * seq_len


def max_seq_len(memory_bytes, batch, n_heads, bytes_per_element=2):
    return math.isqrt(memory_bytes // (batch * n_heads * bytes_per_element))
