"""Hand-rolled loops whose position counter is never reset: it counts on across the document
boundaries, so the positions run 0 .. T - 1 over the whole packed row."""
import math

import torch


def document_ids(cu_seqlens):
    cu = cu_seqlens.tolist()
    ids, doc = [], 0
    for t in range(cu[-1]):
        while t >= cu[doc + 1]:   # past this document's end (an empty document ends where it starts)
            doc += 1
        ids.append(doc)
    return torch.tensor(ids, dtype=torch.long, device=cu_seqlens.device)


def position_ids(cu_seqlens):
    pos = []
    for t in range(int(cu_seqlens[-1])):
        pos.append(0 if t == 0 else pos[-1] + 1)
    return torch.tensor(pos, dtype=torch.long, device=cu_seqlens.device)


def prefix_lm_mask(cu_seqlens, prefix_lens):
    ids, starts = document_ids(cu_seqlens).tolist(), cu_seqlens.tolist()
    prefix = [int(p) for p in prefix_lens]
    T = len(ids)
    mask = torch.zeros(T, T, dtype=torch.bool, device=cu_seqlens.device)
    for i in range(T):
        for j in range(T):
            if ids[i] == ids[j] and (j <= i or j - starts[ids[j]] < prefix[ids[j]]):
                mask[i, j] = True
    return mask


def document_mask(cu_seqlens):
    return prefix_lm_mask(cu_seqlens, [0] * (len(cu_seqlens) - 1))


def packed_attention(q, k, v, cu_seqlens, prefix_lens=None):
    if prefix_lens is None:
        mask = document_mask(cu_seqlens)
    else:
        mask = prefix_lm_mask(cu_seqlens, prefix_lens)
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    for i in range(q.shape[-2]):
        keys = torch.nonzero(mask[i]).flatten().tolist()
        scores = q[..., i:i + 1, :] @ k[..., keys, :].transpose(-2, -1) / math.sqrt(q.shape[-1])
        out[..., i:i + 1, :] = torch.softmax(scores, dim=-1) @ v[..., keys, :]
    return out
