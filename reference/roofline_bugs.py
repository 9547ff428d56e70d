"""Known roofline bugs, each a complete function with exactly that mistake (variants: the same
mistake as different people write it)."""
from fractions import Fraction


def _step(weight_bytes, kv_bytes, flops, hbm_bytes_per_s, flops_per_s):
    memory_s = (weight_bytes + kv_bytes) / hbm_bytes_per_s
    compute_s = flops / flops_per_s
    if Fraction(flops) * Fraction(hbm_bytes_per_s) > Fraction(weight_bytes + kv_bytes) * Fraction(flops_per_s):
        return compute_s, "compute"
    return memory_s, "memory"


# kv-one-token-for-cache: the bytes of one token stand for a whole cache.
def decode_step_kv_one_token(params, kv_bytes_per_token, T, B, hbm_bytes_per_s, flops_per_s, bytes_per_param=2):
    kv_bytes = B * kv_bytes_per_token   # one token per sequence, not its T cached tokens
    return _step(params * bytes_per_param, kv_bytes, 2 * params * B, hbm_bytes_per_s, flops_per_s)


def decode_step_kv_one_token_whole_batch(params, kv_bytes_per_token, T, B, hbm_bytes_per_s, flops_per_s,
                                         bytes_per_param=2):
    kv_bytes = kv_bytes_per_token   # "the KV cache" taken as kv_bytes_per_token itself
    return _step(params * bytes_per_param, kv_bytes, 2 * params * B, hbm_bytes_per_s, flops_per_s)


# kv-read-forgotten: the step reads only the weights.
def decode_step_weights_only(params, kv_bytes_per_token, T, B, hbm_bytes_per_s, flops_per_s, bytes_per_param=2):
    return _step(params * bytes_per_param, 0, 2 * params * B, hbm_bytes_per_s, flops_per_s)


def decode_step_weights_only_time(params, kv_bytes_per_token, T, B, hbm_bytes_per_s, flops_per_s,
                                  bytes_per_param=2):
    memory_s = params * bytes_per_param / hbm_bytes_per_s   # "decode time = model size / bandwidth"
    compute_s = 2 * params * B / flops_per_s
    return (compute_s, "compute") if compute_s > memory_s else (memory_s, "memory")


# batch-raises-attention-intensity: the batch treated as sharing the cache, as it shares the weights.
def attention_decode_intensity_batched(n_heads, n_kv_heads, T, B, bytes_per_element=2):
    flops = 4 * B * n_heads * T                  # B sequences' FLOPs ...
    bytes_read = 2 * n_kv_heads * T * bytes_per_element   # ... over one cache's bytes
    return flops / bytes_read


def decode_intensity_batched_attention(B, T, n_heads, n_kv_heads, bytes_per_param=2, bytes_per_element=2):
    weights = 2 * B / bytes_per_param
    return weights, B * 2 * (n_heads / n_kv_heads) / bytes_per_element   # scaled by B like the weights


def attention_decode_intensity_batched_ignores_gqa(n_heads, n_kv_heads, T, B, bytes_per_element=2):
    return 2 * B / bytes_per_element             # the weight matmuls' intensity used for attention


# train-2n: 2N per token, the forward pass alone, for training.
def train_flops_per_token_2n(N, L, T, d):
    return 2 * N + 12 * L * T * d


def train_flops_per_token_forward_only(N, L, T, d):
    return 2 * N + 4 * L * T * d                 # the forward pass of weights and attention


def train_flops_per_token_kaplan_forward(N, L, T, d):
    return 2 * N + 2 * L * T * d                 # Kaplan et al.'s C_forward


def mfu_2n(tokens_per_s, N, L, T, d, peak_flops_per_s):
    return tokens_per_s * (2 * N + 12 * L * T * d) / peak_flops_per_s


# attention-flops-once: Q @ Kᵀ and weights @ V counted as one matmul of 2·T·d per layer and token.
def train_flops_per_token_attention_once(N, L, T, d):
    return 6 * N + 6 * L * T * d                 # 3 x (2 * T * d), where the forward does 2 * T * d twice


def mfu_attention_once(tokens_per_s, N, L, T, d, peak_flops_per_s):
    return tokens_per_s * train_flops_per_token_attention_once(N, L, T, d) / peak_flops_per_s


# bits-for-bytes: a dtype's bit width where its bytes are meant.
def dtype_bytes_bits(dtype):
    bits = {"fp32": 32, "float32": 32, "bf16": 16, "bfloat16": 16, "fp16": 16, "float16": 16,
            "fp8": 8, "float8": 8, "int8": 8, "int4": 4}
    if dtype not in bits:
        raise ValueError(f"unknown dtype {dtype!r}")
    return bits[dtype]                           # torch.finfo(dtype).bits, not element_size()


def dtype_bytes_int4_as_4(dtype):
    table = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2,
             "fp8": 1, "float8": 1, "int8": 1, "int4": 4}   # "4-bit" read as 4 bytes
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}")
    return table[dtype]


def decode_step_bandwidth_in_bits(params, kv_bytes_per_token, T, B, hbm_bytes_per_s, flops_per_s,
                                  bytes_per_param=2):
    bits_read = 8 * (params * bytes_per_param + B * T * kv_bytes_per_token)   # bits over a bytes/s rate
    return _step(bits_read, 0, 2 * params * B, hbm_bytes_per_s, flops_per_s)


BUGS = {
    "kv-one-token-for-cache": [
        {"decode_step": decode_step_kv_one_token},
        {"decode_step": decode_step_kv_one_token_whole_batch},
    ],
    "kv-read-forgotten": [
        {"decode_step": decode_step_weights_only},
        {"decode_step": decode_step_weights_only_time},
    ],
    "batch-raises-attention-intensity": [
        {"attention_decode_intensity": attention_decode_intensity_batched,
         "decode_intensity": decode_intensity_batched_attention},
        {"attention_decode_intensity": attention_decode_intensity_batched_ignores_gqa},
    ],
    "train-2n": [
        {"train_flops_per_token": train_flops_per_token_2n, "mfu": mfu_2n},
        {"train_flops_per_token": train_flops_per_token_forward_only},
        {"train_flops_per_token": train_flops_per_token_kaplan_forward},
    ],
    "attention-flops-once": {"train_flops_per_token": train_flops_per_token_attention_once, "mfu": mfu_attention_once},
    "bits-for-bytes": [
        {"dtype_bytes": dtype_bytes_bits},
        {"dtype_bytes": dtype_bytes_int4_as_4},
        {"decode_step": decode_step_bandwidth_in_bits},
    ],
}
