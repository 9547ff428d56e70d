"""vLLM's paged_attention_v2 split-KV decode, its block per query head written as a gather: each
query head takes KV head head_idx // num_queries_per_kv, k_chunk[:, kv_head_idx], so the chunk's
keys are copied, and read, once per query head instead of once per KV group. The values are
right."""
import math

import torch


def partial_attention(q, k_chunk, v_chunk):
    acc = torch.promote_types(q.dtype, torch.float32)
    B, H, Tq, D = q.shape
    num_kv_heads = k_chunk.size(1)
    if H % num_kv_heads != 0:
        raise ValueError(f"num_heads ({H}) must be a multiple of num_kv_heads ({num_kv_heads})")
    num_queries_per_kv = H // num_kv_heads
    if k_chunk.size(2) == 0:
        return q.new_zeros(B, H, Tq, D, dtype=acc), q.new_full((B, H, Tq), -math.inf, dtype=acc)
    kv_head_idx = torch.arange(H, device=q.device) // num_queries_per_kv   # (H,) one KV head per query head
    k_heads, v_heads = k_chunk[:, kv_head_idx].to(acc), v_chunk[:, kv_head_idx].to(acc)   # (B, H, Tc, D) copies
    qk = torch.matmul(q.to(acc), k_heads.transpose(2, 3)) / math.sqrt(D)   # (B, H, Tq, Tc)
    max_logits = qk.amax(dim=-1)
    exp_logits = torch.exp(qk - max_logits.unsqueeze(-1))
    exp_sums = exp_logits.sum(dim=-1)
    tmp_out = torch.matmul(exp_logits / exp_sums.unsqueeze(-1), v_heads)
    return tmp_out, max_logits + torch.log(exp_sums)


def merge_partials(outs, lses):
    tmp_out = torch.stack(list(outs)) if isinstance(outs, (list, tuple)) else outs   # (n, B, H, Tq, D)
    lse_buf = torch.stack(list(lses)) if isinstance(lses, (list, tuple)) else lses   # (n, B, H, Tq)
    acc = torch.promote_types(lse_buf.dtype, torch.float32)
    tmp_out, lse_buf = tmp_out.to(acc), lse_buf.to(acc)
    lse = torch.logsumexp(lse_buf, dim=0)   # (B, H, Tq)
    weights = torch.exp(lse_buf - lse)   # (n, B, H, Tq), sum to 1
    return (weights.unsqueeze(-1) * tmp_out).sum(dim=0), lse


def split_kv_decode(q, k, v, n_splits):
    if n_splits <= 0:
        raise ValueError("n_splits must be positive")
    seq_len = k.size(2)
    if seq_len == 0:
        raise ValueError("no keys to attend to")
    B, H, Tq, D = q.shape
    acc = torch.promote_types(q.dtype, torch.float32)
    partition_size = math.ceil(seq_len / n_splits)
    tmp_out = q.new_zeros(n_splits, B, H, Tq, D, dtype=acc)
    lse_buf = q.new_full((n_splits, B, H, Tq), -math.inf, dtype=acc)
    for p in range(n_splits):
        start = p * partition_size
        if start >= seq_len:   # past the end of the cache: nothing to launch
            break
        end = min(start + partition_size, seq_len)
        tmp_out[p], lse_buf[p] = partial_attention(q, k[:, :, start:end], v[:, :, start:end])
    out, _ = merge_partials(tmp_out, lse_buf)
    return out.to(q.dtype)
