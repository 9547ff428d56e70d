"""The roofline of serving and training a transformer: time bounds, arithmetic intensity, MFU.

Letters: N parameters, counting every weight a token is multiplied by, the LM head's included (PaLM's
N is its total count: its input embedding is its LM head); L layers; d = H * head_dim, the width of
all query heads together (PaLM's H·Q), which is d_model only where head_dim = d_model / H; H query
heads, H_kv key/value heads, n_rep = H // H_kv, B batch (sequences), T tokens (cached, or in the
prompt). A multiply-add is 2 FLOPs. Bytes are bytes (8 bits); rates are per second:
hbm_bytes_per_s (HBM bandwidth), flops_per_s (peak FLOP/s of the compute dtype).
"""
from fractions import Fraction

# Bytes of one element of each dtype name. int4 packs two elements in a byte.
_DTYPE_BYTES = {
    "fp32": 4, "float32": 4,
    "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2,
    "fp8": 1, "float8": 1, "int8": 1,
    "int4": 0.5,
}


def dtype_bytes(dtype: str) -> float:
    """Bytes of one element of ``dtype``: "fp32"/"float32" 4, "bf16"/"bfloat16"/"fp16"/"float16" 2,
    "fp8"/"float8"/"int8" 1, "int4" 0.5. Any other name raises ValueError."""
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}")
    return _DTYPE_BYTES[dtype]   # bytes, not bits: bf16 is 16 bits, 2 bytes


def decode_step(params: int, kv_bytes_per_token: int, T: int, B: int, hbm_bytes_per_s: float,
                flops_per_s: float, bytes_per_param: float = 2) -> tuple[float, str]:
    """Lower bound on the time of one decode step, and which bound sets it.

    One step makes one new token for each of ``B`` sequences, each with ``T`` tokens already in
    its KV cache. ``kv_bytes_per_token`` is the K and V of ONE token over all layers
    (2 * L * H_kv * head_dim * bytes per element). The step reads every weight once (shared by the
    batch) and every sequence's whole cache; it computes 2 FLOPs per parameter per sequence
    (attention's own FLOPs, ~n_rep per cached byte, are left out).
    Returns ``(seconds, bound)``: seconds = max(bytes / hbm_bytes_per_s, FLOPs / flops_per_s),
    bound = "compute" where the FLOPs take strictly longer than the bytes, else "memory".
    """
    weight_bytes = params * bytes_per_param               # read once per step, whatever B is
    kv_bytes = B * T * kv_bytes_per_token                 # every sequence reads its own T cached tokens
    flops = 2 * params * B                                # a multiply-add per weight per sequence
    memory_s = (weight_bytes + kv_bytes) / hbm_bytes_per_s
    compute_s = flops / flops_per_s
    # exact comparison (Fraction holds every float exactly): no rounding decides the bound
    compute_bound = Fraction(flops) * Fraction(hbm_bytes_per_s) > Fraction(weight_bytes + kv_bytes) * Fraction(flops_per_s)
    return (compute_s, "compute") if compute_bound else (memory_s, "memory")


def attention_decode_intensity(n_heads: int, n_kv_heads: int, T: int, B: int,
                               bytes_per_element: float = 2) -> float:
    """FLOPs per byte of attention in a decode step: one query token per sequence over its T cached tokens.

    FLOPs: q @ Kᵀ and weights @ V, 2 * T * head_dim each per query head. Bytes: the cached K and V,
    T * head_dim per K/V head each, at bytes_per_element (the one query and output vector are left
    out). head_dim is not an argument: it cancels. B sequences each read their own cache.
    """
    flops = 4 * n_heads * T                               # per sequence, per head_dim: (1, hd) @ (hd, T) and (1, T) @ (T, hd)
    bytes_read = 2 * n_kv_heads * T * bytes_per_element   # per sequence, per head_dim: K and V, (H_kv, T, hd)
    return flops / bytes_read   # = 2 * (n_heads / n_kv_heads) / bytes_per_element, for any B and T


def decode_intensity(B: int, T: int, n_heads: int, n_kv_heads: int, bytes_per_param: float = 2,
                     bytes_per_element: float = 2) -> tuple[float, float]:
    """FLOPs per byte of a decode step, ``(weight matmuls, attention)`` apart.

    Weight matmuls: each weight is read once per step and used by the batch's B token vectors,
    2 FLOPs each (activations left out). Attention: as ``attention_decode_intensity``.
    """
    weights = 2 * B / bytes_per_param                     # 2 * N * B FLOPs over N * bytes_per_param bytes
    attention = attention_decode_intensity(n_heads, n_kv_heads, T, B, bytes_per_element)
    return weights, attention


def prefill_intensity(B: int, T: int, n_heads: int, n_kv_heads: int, bytes_per_param: float = 2,
                      bytes_per_element: float = 2) -> tuple[float, float]:
    """FLOPs per byte of a prefill of B prompts of T tokens, ``(weight matmuls, attention)`` apart.

    Weight matmuls: each weight is read once and used by all B * T tokens, 2 FLOPs each
    (activations left out). Attention, fused (the scores never leave the chip): FLOPs of Q @ Kᵀ and
    weights @ V over all T x T pairs (no causal discount); bytes: the compulsory ones, each tensor
    touched once, Q and O, (B, H, T, hd), and K and V, (B, H_kv, T, hd), at bytes_per_element. So
    the attention part is an upper bound: a tiled kernel reads K and V again for each tile of
    queries. head_dim is not an argument: it cancels.
    """
    weights = 2 * B * T / bytes_per_param
    flops = 4 * B * n_heads * T * T                       # per head_dim: Q @ Kᵀ and weights @ V
    bytes_moved = (2 * n_heads + 2 * n_kv_heads) * B * T * bytes_per_element   # per head_dim: Q, O; K, V, each touched once
    return weights, flops / bytes_moved


def crossover_batch(flops_per_s: float, hbm_bytes_per_s: float, bytes_per_param: float = 2) -> float:
    """The batch size at which decoding's weight matmuls take as long on the FLOPs as on the bytes.

    Each weight is read once per step (bytes_per_param bytes) and multiplied by the B token
    vectors, 2 FLOPs each; the KV cache and activations are left out. Above this batch the
    weight matmuls are compute-bound. A real number, not rounded to a whole batch.
    """
    return flops_per_s * bytes_per_param / (2 * hbm_bytes_per_s)


def train_flops_per_token(N: int, L: int, T: int, d: int) -> int:
    """Training FLOPs (forward and backward) per token of a decoder of N parameters (every weight
    a token is multiplied by, the LM head's included), L layers and d = n_heads * head_dim, on
    sequences of T tokens.

    Counts the matmuls with the weights and attention's Q @ Kᵀ and weights @ V, forward and
    backward, as PaLM does (Chowdhery et al., 2022, Appendix B): no causal discount.
    """
    weights = 6 * N                                       # forward 2N + backward 4N
    attention = 12 * L * T * d                            # 3 x (2 * T * d for Q @ Kᵀ + 2 * T * d for weights @ V), per layer
    return weights + attention


def mfu(tokens_per_s: float, N: int, L: int, T: int, d: int, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation of training: the model's FLOPs per second over the peak.

    ``tokens_per_s`` is the training throughput and ``peak_flops_per_s`` the peak of all the
    devices together. A fraction in [0, 1] for a real run (not a percentage).
    """
    return tokens_per_s * train_flops_per_token(N, L, T, d) / peak_flops_per_s
