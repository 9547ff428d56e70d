"""Mistral's reference code with the softmax over axis 2 of the (bsz, n_heads, q_len, kv_len) scores,
the queries, where the keys, axis 3 (-1), belong: each key's weights sum to 1 across the queries."""
import math

import torch


def sliding_window_mask(Tq, Tk, window, device=None):
    if window < 1 or Tq > Tk:
        raise ValueError(f"window ({window}) must be >= 1 and Tq ({Tq}) <= Tk ({Tk})")
    mask = torch.full((Tq, Tk), fill_value=1, dtype=torch.bool, device=device)
    mask = torch.tril(mask, diagonal=Tk - Tq)
    # make the mask banded to account for sliding window
    return torch.triu(mask, diagonal=Tk - Tq - window + 1)


def sliding_window_attention(q, k, v, window):
    mask = sliding_window_mask(q.shape[-2], k.shape[-2], window, device=q.device)
    bias = torch.log(mask.to(q.dtype))   # 0 where allowed, -inf where not
    scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.shape[-1])
    scores = scores + bias
    return torch.matmul(scores.float().softmax(dim=2).type_as(q), v)


def unrotate(cache, seqlen):
    """The tokens a rotating cache holds, oldest first."""
    position = seqlen % cache.shape[2]
    if seqlen < cache.shape[2]:
        return cache[:, :, :seqlen]
    elif position == 0:
        return cache
    return torch.cat([cache[:, :, position:], cache[:, :, :position]], dim=2)


class RollingKVCache:
    def __init__(self, window):
        if window < 1:
            raise ValueError(f"sliding window must be >= 1, got {window}")
        self.sliding_window = window
        self.cache_k = self.cache_v = None
        self.seqlen = 0

    def __len__(self):
        return self.seqlen

    def append(self, xk, xv):
        bsz, n_heads, seqlen, head_dim = xk.shape
        if self.cache_k is None:
            self.cache_k = torch.empty(bsz, n_heads, self.sliding_window, head_dim, dtype=xk.dtype, device=xk.device)
            self.cache_v = torch.empty(bsz, n_heads, self.sliding_window, xv.shape[-1], dtype=xv.dtype, device=xv.device)
        keep = min(self.seqlen, self.sliding_window - 1)
        held_k, held_v = unrotate(self.cache_k, self.seqlen), unrotate(self.cache_v, self.seqlen)
        keys = torch.cat([held_k[:, :, held_k.shape[2] - keep:], xk], dim=2)
        values = torch.cat([held_v[:, :, held_v.shape[2] - keep:], xv], dim=2)
        for i in range(max(seqlen - self.sliding_window, 0), seqlen):
            slot = (self.seqlen + i) % self.sliding_window
            self.cache_k[:, :, slot] = xk[:, :, i]
            self.cache_v[:, :, slot] = xv[:, :, i]
        self.seqlen += seqlen
        return keys, values
