"""Known flops-memory bugs, each a complete function with exactly that mistake."""


def attention_flops_macs(batch, seq_len, d_model, n_heads, n_kv_heads=None):
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    head_dim = d_model // n_heads
    kv_dim = n_kv_heads * head_dim
    projections = batch * seq_len * d_model * (2 * d_model + 2 * kv_dim)   # multiply-adds, not FLOPs
    attention = 2 * batch * n_heads * seq_len * seq_len * head_dim   # Q @ Kᵀ and weights @ V, multiply-adds too
    return projections + attention


def attention_flops_missing_projections(batch, seq_len, d_model, n_heads, n_kv_heads=None):
    head_dim = d_model // n_heads
    return 2 * (2 * batch * n_heads * seq_len * seq_len * head_dim)   # Q @ Kᵀ and weights @ V only


def attention_params_ignores_kv_heads(d_model, n_heads, n_kv_heads=None, bias=False):
    weights = 4 * d_model * d_model   # W_k and W_v sized as in MHA, whatever n_kv_heads is
    return weights + (4 * d_model if bias else 0)


def kv_cache_bytes_missing_kv_factor(batch, seq_len, n_layers, n_kv_heads, head_dim, bytes_per_element=2):
    return n_layers * batch * n_kv_heads * seq_len * head_dim * bytes_per_element   # K only, no V


def kv_cache_bytes_missing_layers(batch, seq_len, n_layers, n_kv_heads, head_dim, bytes_per_element=2):
    return 2 * batch * n_kv_heads * seq_len * head_dim * bytes_per_element   # one layer's cache


def max_seq_len_off_by_one(memory_bytes, batch, n_heads, bytes_per_element=2):
    T = 0
    while batch * n_heads * T * T * bytes_per_element <= memory_bytes:
        T += 1
    return T   # the loop stops at the first T that does NOT fit


BUGS = {
    "flops-counted-macs": {"attention_flops": attention_flops_macs},
    "flops-missing-projections": {"attention_flops": attention_flops_missing_projections},
    "params-ignores-kv-heads": {"attention_params": attention_params_ignores_kv_heads},
    "kv-cache-missing-kv-factor": {"kv_cache_bytes": kv_cache_bytes_missing_kv_factor},
    "kv-cache-missing-layers": {"kv_cache_bytes": kv_cache_bytes_missing_layers},
    "max-seq-len-off-by-one": {"max_seq_len": max_seq_len_off_by_one},
}
