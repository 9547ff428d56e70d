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
    B, H, Tq, hd = q.shape
    Hkv, Tc = k_chunk.size(1), k_chunk.size(-2)
    if H % Hkv != 0:
        raise ValueError(f"q's {H} heads are not a whole number of groups of k's {Hkv} KV heads")
    n_rep = H // Hkv   # query heads per KV head: the group size
    acc_dtype = torch.promote_types(q.dtype, torch.float32)   # partials are never kept in half precision
    if Tc == 0:   # no keys: no weight (exp(lse) = 0), and an output that any weight 0 cancels
        return (q.new_zeros(B, H, Tq, hd, dtype=acc_dtype),
                q.new_full((B, H, Tq), float("-inf"), dtype=acc_dtype))
    # A group's n_rep query heads become the rows of one matrix (heads g*n_rep .. g*n_rep + n_rep - 1
    # are adjacent): each KV head is read once for its whole group, never copied per query head.
    q = q.to(acc_dtype).reshape(B, Hkv, n_rep * Tq, hd)   # (B, Hkv, n_rep*Tq, hd)
    k_chunk, v_chunk = k_chunk.to(acc_dtype), v_chunk.to(acc_dtype)
    s = (q @ k_chunk.transpose(-2, -1)) / math.sqrt(hd)   # (B, Hkv, n_rep*Tq, Tc)
    m = s.amax(dim=-1)   # (B, Hkv, n_rep*Tq) the chunk's largest score per query
    p = torch.exp(s - m[..., None])   # (B, Hkv, n_rep*Tq, Tc), each <= 1: no overflow
    l = p.sum(dim=-1)   # (B, Hkv, n_rep*Tq), >= 1
    out = (p @ v_chunk) / l[..., None]   # (B, Hkv, n_rep*Tq, hd) normalised within the chunk
    lse = m + torch.log(l)   # (B, Hkv, n_rep*Tq) log sum exp(s) = m + log sum exp(s - m)
    return out.reshape(B, H, Tq, hd), lse.reshape(B, H, Tq)   # the rows back to their query heads


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
    outs = torch.stack(list(outs))   # (n, B, H, Tq, hd)
    lses = torch.stack(list(lses))   # (n, B, H, Tq)
    acc_dtype = torch.promote_types(torch.promote_types(outs.dtype, lses.dtype), torch.float32)
    outs, lses = outs.to(acc_dtype), lses.to(acc_dtype)
    m = lses.amax(dim=0)   # (B, H, Tq) the largest chunk lse per query
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)   # every chunk empty: avoid -inf - (-inf)
    w = torch.exp(lses - m)   # (n, B, H, Tq) exp(lse_j - m), each <= 1; 0 for an empty chunk
    l = w.sum(dim=0)   # (B, H, Tq) sum_j exp(lse_j - m)
    out = (w[..., None] * outs).sum(dim=0) / l.clamp_min(torch.finfo(acc_dtype).tiny)[..., None]   # (B, H, Tq, hd)
    lse = m + torch.log(l)   # (B, H, Tq) log sum_j exp(lse_j); -inf when every chunk is empty
    return out, lse


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
    Tk = k.size(-2)
    if n_splits < 1:
        raise ValueError(f"n_splits ({n_splits}) must be at least 1")
    if Tk == 0:
        raise ValueError("the KV cache is empty: a query needs at least one key")
    chunk = math.ceil(Tk / n_splits)   # keys per split; n_splits * chunk >= Tk
    outs, lses = [], []
    for i in range(n_splits):   # independent: on a GPU, one thread block per (sequence, KV head, split)
        s0, s1 = min(i * chunk, Tk), min((i + 1) * chunk, Tk)   # empty when s0 == s1 == Tk
        out_i, lse_i = partial_attention(q, k[:, :, s0:s1], v[:, :, s0:s1])   # (B, H, Tq, hd), (B, H, Tq)
        outs.append(out_i)
        lses.append(lse_i)
    out, _ = merge_partials(outs, lses)   # (B, H, Tq, hd)
    return out.to(q.dtype)
