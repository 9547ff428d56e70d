"""Back-of-the-envelope arithmetic of one self-attention layer: parameters, FLOPs and bytes.

Every answer is an exact Python int: parameters, FLOPs and bytes are counts.
"""


def attention_params(d_model: int, n_heads: int, n_kv_heads: int | None = None, bias: bool = False) -> int:
    """Parameters of one self-attention layer: the Q, K, V and output projections.

    W_q and W_o map d_model to d_model; W_k and W_v map d_model to n_kv_heads * head_dim, with
    head_dim = d_model // n_heads. ``n_kv_heads=None`` means n_heads (multi-head attention); fewer
    K/V heads is grouped-query attention. ``bias=True`` adds one bias per output of each projection.
    """
    raise NotImplementedError("write attention_params")


def attention_flops(batch: int, seq_len: int, d_model: int, n_heads: int, n_kv_heads: int | None = None) -> int:
    """Forward FLOPs of one self-attention layer on a ``(batch, seq_len, d_model)`` input.

    Counts the Q, K, V and output projections, ``Q @ Kᵀ`` and ``weights @ V``, at 2 FLOPs per
    multiply-add (the ``torch.utils.flop_counter`` convention). Softmax, scaling and masking are
    not counted, and a causal mask is not discounted: the full T x T scores are computed.
    """
    raise NotImplementedError("write attention_flops")


def attention_scores_bytes(batch: int, n_heads: int, seq_len: int, bytes_per_element: int = 4) -> int:
    """Bytes of the ``(batch, n_heads, seq_len, seq_len)`` attention scores of one layer."""
    raise NotImplementedError("write attention_scores_bytes")


def kv_cache_bytes(batch: int, seq_len: int, n_layers: int, n_kv_heads: int, head_dim: int,
                   bytes_per_element: int = 2) -> int:
    """Bytes of a KV cache holding ``seq_len`` tokens: K and V of shape
    ``(batch, n_kv_heads, seq_len, head_dim)`` in each of ``n_layers`` layers."""
    raise NotImplementedError("write kv_cache_bytes")


def max_seq_len(memory_bytes: int, batch: int, n_heads: int, bytes_per_element: int = 2) -> int:
    """The largest T whose ``(batch, n_heads, T, T)`` scores fit in ``memory_bytes``."""
    raise NotImplementedError("write max_seq_len")
