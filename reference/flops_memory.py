"""Back-of-the-envelope arithmetic of one self-attention layer: parameters, FLOPs and bytes.

Letters: B batch, T sequence length, d d_model, H query heads, H_kv key/value heads,
hd = d // H the head size, L layers. Every answer is an exact Python int.
"""
import math


def attention_params(d_model: int, n_heads: int, n_kv_heads: int | None = None, bias: bool = False) -> int:
    """Parameters of one self-attention layer: the Q, K, V and output projections.

    W_q and W_o map d_model to d_model; W_k and W_v map d_model to n_kv_heads * head_dim, with
    head_dim = d_model // n_heads. ``n_kv_heads=None`` means n_heads (multi-head attention); fewer
    K/V heads is grouped-query attention. ``bias=True`` adds one bias per output of each projection.
    """
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    kv_dim = n_kv_heads * (d_model // n_heads)   # GQA shrinks K and V only: every query head stays
    weights = 2 * d_model * d_model + 2 * d_model * kv_dim   # W_q, W_o; W_k, W_v
    biases = 2 * d_model + 2 * kv_dim if bias else 0
    return weights + biases


def attention_flops(batch: int, seq_len: int, d_model: int, n_heads: int, n_kv_heads: int | None = None) -> int:
    """Forward FLOPs of one self-attention layer on a ``(batch, seq_len, d_model)`` input.

    Counts the Q, K, V and output projections, ``Q @ Kᵀ`` and ``weights @ V``, at 2 FLOPs per
    multiply-add (the ``torch.utils.flop_counter`` convention). Softmax, scaling and masking are
    not counted, and a causal mask is not discounted: the full T x T scores are computed.
    """
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    head_dim = d_model // n_heads
    kv_dim = n_kv_heads * head_dim
    tokens = batch * seq_len
    # (BT, d) @ (d, n) is BT * d * n multiply-adds; the four projections output d + 2 kv_dim + d.
    projections = 2 * tokens * d_model * (2 * d_model + 2 * kv_dim)
    # Q @ Kᵀ: (B, H, T, hd) @ (B, H, hd, T). With GQA each K head serves a group of query heads,
    # but every query head still takes its own dot products.
    scores = 2 * batch * n_heads * seq_len * seq_len * head_dim
    mix = 2 * batch * n_heads * seq_len * seq_len * head_dim   # weights @ V: (B, H, T, T) @ (B, H, T, hd)
    return projections + scores + mix


def attention_scores_bytes(batch: int, n_heads: int, seq_len: int, bytes_per_element: int = 4) -> int:
    """Bytes of the ``(batch, n_heads, seq_len, seq_len)`` attention scores of one layer."""
    return batch * n_heads * seq_len * seq_len * bytes_per_element   # one score per (query, key) pair


def kv_cache_bytes(batch: int, seq_len: int, n_layers: int, n_kv_heads: int, head_dim: int,
                   bytes_per_element: int = 2) -> int:
    """Bytes of a KV cache holding ``seq_len`` tokens: K and V of shape
    ``(batch, n_kv_heads, seq_len, head_dim)`` in each of ``n_layers`` layers."""
    per_tensor = batch * n_kv_heads * seq_len * head_dim * bytes_per_element   # (B, H_kv, T, hd)
    return 2 * n_layers * per_tensor   # a K and a V in every layer


def max_seq_len(memory_bytes: int, batch: int, n_heads: int, bytes_per_element: int = 2) -> int:
    """The largest T whose ``(batch, n_heads, T, T)`` scores fit in ``memory_bytes``."""
    per_pair = batch * n_heads * bytes_per_element   # bytes of one (query, key) pair over all heads
    # T * T * per_pair <= memory  <=>  T * T <= memory // per_pair, and isqrt is exact where
    # math.sqrt rounds: no float can push T one past the boundary.
    return math.isqrt(memory_bytes // per_pair)
