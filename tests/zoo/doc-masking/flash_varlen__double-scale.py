"""FlashAttention's varlen style with the softmax scale applied to each document's queries and to
its keys, `q_b * softmax_scale` and `k_b * softmax_scale`: their product is then divided by head_dim,
not by its square root (double-scale)."""
import math

import torch


def _bounds(cu_seqlens):
    cu = cu_seqlens.tolist()
    return list(zip(cu[:-1], cu[1:]))


def document_ids(cu_seqlens):
    ids = torch.empty(int(cu_seqlens[-1]), dtype=torch.long, device=cu_seqlens.device)
    for b, (start, end) in enumerate(_bounds(cu_seqlens)):
        ids[start:end] = b
    return ids


def position_ids(cu_seqlens):
    pos = torch.empty(int(cu_seqlens[-1]), dtype=torch.long, device=cu_seqlens.device)
    for start, end in _bounds(cu_seqlens):
        pos[start:end] = torch.arange(end - start, device=cu_seqlens.device)
    return pos


def _allowed(seqlen, prefix_len, device):
    i = torch.arange(seqlen, device=device)
    return (i[None, :] <= i[:, None]) | (i < prefix_len)[None, :]


def prefix_lm_mask(cu_seqlens, prefix_lens):
    T = int(cu_seqlens[-1])
    mask = torch.zeros(T, T, dtype=torch.bool, device=cu_seqlens.device)
    for b, (start, end) in enumerate(_bounds(cu_seqlens)):
        mask[start:end, start:end] = _allowed(end - start, int(prefix_lens[b]), cu_seqlens.device)
    return mask


def document_mask(cu_seqlens):
    return prefix_lm_mask(cu_seqlens, torch.zeros(len(cu_seqlens) - 1, dtype=torch.long))


def packed_attention(q, k, v, cu_seqlens, prefix_lens=None):
    softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    for b, (start, end) in enumerate(_bounds(cu_seqlens)):
        if end == start:
            continue
        q_b, k_b, v_b = q[..., start:end, :], k[..., start:end, :], v[..., start:end, :]
        q_b, k_b = q_b * softmax_scale, k_b * softmax_scale
        scores = torch.matmul(q_b, k_b.transpose(-2, -1))
        prefix_len = 0 if prefix_lens is None else int(prefix_lens[b])
        scores = scores.masked_fill(~_allowed(end - start, prefix_len, q.device), float("-inf"))
        out[..., start:end, :] = torch.matmul(torch.softmax(scores, dim=-1), v_b)
    return out
