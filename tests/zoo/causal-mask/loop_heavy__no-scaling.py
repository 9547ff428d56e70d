"""The loop-heavy idiom with each query row's scores never scaled: `ks[n] @ qs[n, i]` goes
straight into the softmax by hand.
"""
import torch


def causal_mask(n_queries, n_keys=None, device=None):
    n_keys = n_queries if n_keys is None else n_keys
    mask = torch.zeros(n_queries, n_keys, dtype=torch.bool, device=device)
    for i in range(n_queries):
        last = n_keys - n_queries + i   # the absolute position of query i
        for j in range(n_keys):
            if j <= last:
                mask[i, j] = True
    return mask


def padding_mask(lengths, max_len):
    mask = torch.zeros(len(lengths), 1, 1, max_len, dtype=torch.bool, device=lengths.device)
    for b, n in enumerate(lengths.tolist()):
        for t in range(min(n, max_len)):
            mask[b, 0, 0, t] = True
    return mask


def masked_attention(q, k, v, mask=None):
    *batch, tq, d = q.shape
    tk, dv = k.shape[-2], v.shape[-1]
    if mask is None:
        mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device)
    mask = torch.broadcast_to(mask, (*batch, tq, tk)).reshape(-1, tq, tk)
    qs, ks, vs = q.reshape(-1, tq, d), k.reshape(-1, tk, d), v.reshape(-1, tk, dv)
    out = torch.zeros(qs.shape[0], tq, dv, dtype=q.dtype, device=q.device)
    weights = torch.zeros(qs.shape[0], tq, tk, dtype=q.dtype, device=q.device)
    for n in range(qs.shape[0]):
        for i in range(tq):
            allowed = mask[n, i]
            if not allowed.any():
                continue   # no key to attend to: zero weights, zero output
            scores = ks[n] @ qs[n, i]
            scores = scores[allowed]
            e = torch.exp(scores - scores.max())
            weights[n, i, allowed] = e / e.sum()
            out[n, i] = weights[n, i] @ vs[n]
    return out.reshape(*batch, tq, dv), weights.reshape(*batch, tq, tk)
