"""The searchsorted idiom without right=True: a token equal to a document's end, the first token of
the next document, is counted in the document it ends, so it attends to that document and gets its
next position."""
import math

import torch


def document_ids(cu_seqlens):
    ends = cu_seqlens[1:].long().contiguous()
    tokens = torch.arange(int(cu_seqlens[-1]), device=cu_seqlens.device)
    return torch.searchsorted(ends, tokens)


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
    return torch.einsum("...qk,...kd->...qd", scores.softmax(dim=-1), v)
