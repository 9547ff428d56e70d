"""The style of "transformer inference arithmetic" posts: named per-step costs in seconds,
sizes from bit widths, and the bound as whichever named time is larger.
"""

BIT_WIDTHS = {"fp32": 32, "float32": 32, "bf16": 16, "bfloat16": 16, "fp16": 16, "float16": 16,
              "fp8": 8, "float8": 8, "int8": 8, "int4": 4}


def dtype_bytes(dtype):
    if dtype not in BIT_WIDTHS:
        raise ValueError("unsupported dtype " + repr(dtype))
    return BIT_WIDTHS[dtype] / 8


def decode_step(params, kv_bytes_per_token, T, B, hbm_bytes_per_s, flops_per_s, bytes_per_param=2):
    weights_s = params * bytes_per_param / hbm_bytes_per_s
    kv_s = B * T * kv_bytes_per_token / hbm_bytes_per_s
    flops_s = 2 * params * B / flops_per_s
    # compared as one sum of bytes, so that a tie stays a tie
    if 2 * params * B * hbm_bytes_per_s > (params * bytes_per_param + B * T * kv_bytes_per_token) * flops_per_s:
        return flops_s, "compute"
    return weights_s + kv_s, "memory"


def attention_decode_intensity(n_heads, n_kv_heads, T, B, bytes_per_element=2):
    n_rep = n_heads / n_kv_heads
    return 2 * n_rep / bytes_per_element


def decode_intensity(B, T, n_heads, n_kv_heads, bytes_per_param=2, bytes_per_element=2):
    return 2 * B / bytes_per_param, attention_decode_intensity(n_heads, n_kv_heads, T, B, bytes_per_element)


def prefill_intensity(B, T, n_heads, n_kv_heads, bytes_per_param=2, bytes_per_element=2):
    n_rep = n_heads / n_kv_heads
    return 2 * B * T / bytes_per_param, 2 * T * n_rep / ((n_rep + 1) * bytes_per_element)


def crossover_batch(flops_per_s, hbm_bytes_per_s, bytes_per_param=2):
    return 0.5 * bytes_per_param * flops_per_s / hbm_bytes_per_s


def train_flops_per_token(N, L, T, d):
    forward = 2 * N + 2 * L * T * d   # weights, then attention: each token against T keys of width d
    return 3 * forward


def mfu(tokens_per_s, N, L, T, d, peak_flops_per_s):
    achieved = tokens_per_s * train_flops_per_token(N, L, T, d)
    return achieved / peak_flops_per_s
