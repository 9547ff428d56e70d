"""Flash-Decoding in PyTorch: one decoding step's attention over a long KV cache, split into chunks
that could run in parallel, each returning its output and log-sum-exp, merged exactly afterwards."""
import math

import torch


def partial_attention(q: torch.Tensor, k_chunk: torch.Tensor,
                      v_chunk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q over one chunk of the keys, normalised within the chunk.

    q ``(B, H, Tq, head_dim)`` (Tq = 1 when decoding), k_chunk and v_chunk ``(B, H_kv, Tc, head_dim)``
    with H_kv dividing H: query head h reads KV head h // (H // H_kv) (H_kv = H is plain multi-head
    attention). Returns ``(out, lse)``: out ``(B, H, Tq, head_dim)`` = softmax(q k_chunkᵀ / sqrt(head_dim))
    v_chunk and lse ``(B, H, Tq)`` = the natural log of the sum of exp(score) over the chunk's keys.
    Both come back in q's dtype promoted to at least float32 (float16 and bfloat16 inputs give float32
    partials, as Flash-Decoding's kernels store them). An empty chunk (Tc = 0) gives out = 0 and
    lse = -inf: it holds no weight at all. Raises ValueError when H_kv does not divide H.
    """
    # scores of q against the chunk (a KV group's query heads as the rows of one matrix), their max,
    # exp, sum: out and lse; an empty chunk first
    raise NotImplementedError("write partial_attention")


def merge_partials(outs, lses) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge the partial results of disjoint chunks of the same keys into the exact attention.

    outs: a sequence of n tensors ``(B, H, Tq, head_dim)`` (or one tensor ``(n, B, H, Tq, head_dim)``),
    each normalised within its chunk; lses: n tensors ``(B, H, Tq)`` (or ``(n, B, H, Tq)``), each
    chunk's log-sum-exp, -inf for an empty chunk. Returns ``(out, lse)`` over all the chunks'
    keys together: out ``(B, H, Tq, head_dim)`` = Σ_j exp(lse_j - lse) out_j and lse ``(B, H, Tq)``
    = log Σ_j exp(lse_j), in the partials' dtype promoted to at least float32. Since it returns an
    lse too, merged results merge again (a tree of merges gives the same answer, in any order). A
    partial whose lse is -inf (an empty chunk, out = 0) gets weight 0. Merging only empty partials
    (no key at all) is not graded.
    """
    # weights exp(lse_j - lse), with the largest lse_j subtracted before any exp
    raise NotImplementedError("write merge_partials")


def split_kv_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_splits: int) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(head_dim)) v for one decoding step, the cache split into n_splits chunks.

    q ``(B, H, Tq, head_dim)`` (Tq = 1 when decoding: the new token attends to the whole cache, no
    mask), k and v ``(B, H_kv, Tk, head_dim)`` with H_kv dividing H (query head h reads KV head
    h // (H // H_kv), the grouping of F.scaled_dot_product_attention(..., enable_gqa=True)). The
    keys are split into n_splits contiguous chunks of ceil(Tk / n_splits) keys (the last ones
    shorter, or empty when n_splits > Tk), each attended by partial_attention, the partials merged
    by merge_partials. Returns out ``(B, H, Tq, head_dim)`` in q's dtype, equal to
    F.scaled_dot_product_attention(q, k, v, enable_gqa=True) for every n_splits. Raises ValueError
    when n_splits < 1, when the cache is empty (Tk = 0) or when H_kv does not divide H.
    """
    # n_splits contiguous chunks of the keys, a partial each, then one merge; `kata hint flash-decoding` when stuck
    raise NotImplementedError("write split_kv_decode")
