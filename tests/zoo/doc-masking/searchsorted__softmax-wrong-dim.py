"""The searchsorted idiom whose einsum attention normalises the scores over the queries:
`scores.softmax(dim=-2)` on the "...qk" scores, the axis of q, so each key's column sums to 1 and no
query's weights over the keys do (softmax-wrong-dim)."""
import math

import torch


def document_ids(cu_seqlens):
    ends = cu_seqlens[1:].long().contiguous()
    tokens = torch.arange(int(cu_seqlens[-1]), device=cu_seqlens.device)
    return torch.searchsorted(ends, tokens, right=True)


def position_ids(cu_seqlens):
    tokens = torch.arange(int(cu_seqlens[-1]), device=cu_seqlens.device)
    return tokens - cu_seqlens.long()[document_ids(cu_seqlens)]


def _mask(cu_seqlens, prefix_lens=None):
    doc, pos = document_ids(cu_seqlens), position_ids(cu_seqlens)
    allowed = pos.unsqueeze(0) <= pos.unsqueeze(1)
    if prefix_lens is not None:
        allowed = allowed | (pos < prefix_lens.to(doc.device)[doc]).unsqueeze(0)
    return (doc.unsqueeze(0) == doc.unsqueeze(1)) & allowed


def document_mask(cu_seqlens):
    return _mask(cu_seqlens)


def prefix_lm_mask(cu_seqlens, prefix_lens):
    return _mask(cu_seqlens, prefix_lens)


def packed_attention(q, k, v, cu_seqlens, prefix_lens=None):
    allowed = _mask(cu_seqlens, prefix_lens).to(q.device)
    scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
    scores = torch.where(allowed, scores, torch.tensor(float("-inf"), dtype=scores.dtype, device=scores.device))
    return torch.einsum("...qk,...kd->...qd", scores.softmax(dim=-2), v)
