"""Known sliding-window bugs, each the reference with exactly that mistake. A mask bug comes with
the attention that uses it: the reference's attention calls the reference's own mask."""
import math

import torch
import torch.nn.functional as F

from reference.sliding_window import RollingKVCache, sliding_window_mask


def _attend(q, k, v, allowed):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v


def _back(Tq, Tk, device, window):
    if window < 1 or Tq > Tk:
        raise ValueError(f"bad arguments: Tq={Tq}, Tk={Tk}, window={window}")
    return torch.arange(Tk - Tq, Tk, device=device)[:, None] - torch.arange(Tk, device=device)[None, :]


def mask_window_plus_one(Tq, Tk, window, device=None):
    back = _back(Tq, Tk, device, window)
    return (back >= 0) & (back <= window)   # window + 1 keys: the query and window keys before it


def attention_window_plus_one(q, k, v, window):
    return _attend(q, k, v, mask_window_plus_one(q.size(-2), k.size(-2), window, q.device))


def mask_window_minus_one(Tq, Tk, window, device=None):
    back = _back(Tq, Tk, device, window)
    return (back >= 0) & (back < window - 1)   # window - 1 keys: the oldest one is lost


def attention_window_minus_one(q, k, v, window):
    return _attend(q, k, v, mask_window_minus_one(q.size(-2), k.size(-2), window, q.device))


def mask_symmetric(Tq, Tk, window, device=None):
    return _back(Tq, Tk, device, window).abs() < window   # a band on both sides: window - 1 future keys too


def attention_symmetric(q, k, v, window):
    return _attend(q, k, v, mask_symmetric(q.size(-2), k.size(-2), window, q.device))


def mask_no_causal_bound(Tq, Tk, window, device=None):
    return _back(Tq, Tk, device, window) < window   # only the far edge: every future key is allowed


def attention_no_causal_bound(q, k, v, window):
    return _attend(q, k, v, mask_no_causal_bound(q.size(-2), k.size(-2), window, q.device))


def mask_top_left(Tq, Tk, window, device=None):
    back = _back(Tq, Tk, device, window) - (Tk - Tq)   # query i taken to sit at position i, not Tk - Tq + i
    return (back >= 0) & (back < window)


def attention_top_left(q, k, v, window):
    return _attend(q, k, v, mask_top_left(q.size(-2), k.size(-2), window, q.device))


def attention_no_scaling(q, k, v, window):
    allowed = sliding_window_mask(q.size(-2), k.size(-2), window, device=q.device)
    scores = q @ k.transpose(-2, -1)   # never divided by sqrt(hd)
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v


def attention_double_scale(q, k, v, window):
    q = q / math.sqrt(q.size(-1))   # q scaled, and _attend scales the scores again: divided by hd in all
    return _attend(q, k, v, sliding_window_mask(q.size(-2), k.size(-2), window, device=q.device))


def attention_softmax_wrong_dim(q, k, v, window):
    allowed = sliding_window_mask(q.size(-2), k.size(-2), window, device=q.device)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-2) @ v   # over the queries, not the keys


def attention_banned(q, k, v, window):
    allowed = sliding_window_mask(q.size(-2), k.size(-2), window, device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


class RollingKVCacheSlotOrder(RollingKVCache):
    def _last(self, buffer, n):
        slots = torch.arange(self.seen - n, self.seen, device=buffer.device) % self.window
        return buffer[..., slots.sort().values, :]   # the buffer as it lies in memory: never unrotated


class RollingKVCacheSlotOrderCut(RollingKVCache):
    def _last(self, buffer, n):
        held = buffer[..., :min(self.seen, self.window), :]   # the slots in use, slot 0 first: never unrotated
        return held[..., held.size(-2) - n:, :]   # its last n slots, not its last n tokens


class RollingKVCacheWholeBuffer(RollingKVCache):
    def append(self, k, v):
        held = 0 if self.k is None else min(self.seen, self.window)
        k_held = None if self.k is None else self.k[..., :held, :].clone()   # every slot, as it lies in memory
        v_held = None if self.v is None else self.v[..., :held, :].clone()
        super().append(k, v)
        if k_held is None:
            return k, v
        # the chunk after the whole buffer: one token too old, which the band mask drops, and slot order
        return torch.cat([k_held, k], dim=-2), torch.cat([v_held, v], dim=-2)


class RollingKVCacheBufferNewestFirst(RollingKVCache):
    def _last(self, buffer, n):
        slots = torch.arange(self.seen - 1, self.seen - 1 - n, -1, device=buffer.device) % self.window
        return buffer[..., slots, :]   # walked back from the newest token: newest first


class RollingKVCacheNewestFirst(RollingKVCache):
    def append(self, k, v):
        k_win, v_win = super().append(k, v)
        return k_win.flip(-2), v_win.flip(-2)   # newest first


class RollingKVCacheWritesFirst(RollingKVCache):
    def append(self, k, v):
        t_new = k.size(-2)
        if self.k is None:
            self.k = k.new_zeros(*k.shape[:-2], self.window, k.size(-1))
            self.v = v.new_zeros(*v.shape[:-2], self.window, v.size(-1))
        kept = min(t_new, self.window)
        slots = torch.arange(self.seen + t_new - kept, self.seen + t_new, device=k.device) % self.window
        self.k[..., slots, :] = k[..., t_new - kept:, :]   # written first: the chunk overwrites slots
        self.v[..., slots, :] = v[..., t_new - kept:, :]   # its first queries still need
        before = min(self.seen, self.window - 1)
        k_win = torch.cat([self._last(self.k, before), k], dim=-2)
        v_win = torch.cat([self._last(self.v, before), v], dim=-2)
        self.seen += t_new
        return k_win, v_win


class RollingKVCachePushesFirst(RollingKVCache):
    def append(self, k, v):
        super().append(k, v)   # the chunk stored first, as onto a deque(maxlen=window)
        before = min(self.seen, self.window - 1)   # then its newest tokens read: the chunk's among them
        return torch.cat([self._last(self.k, before), k], dim=-2), torch.cat([self._last(self.v, before), v], dim=-2)


class RollingKVCacheConcat(RollingKVCache):
    def append(self, k, v):
        before = min(self.seen, self.window - 1)
        self.k = k if self.k is None else torch.cat([self.k, k], dim=-2)   # every token ever seen
        self.v = v if self.v is None else torch.cat([self.v, v], dim=-2)
        self.seen += k.size(-2)
        n = before + k.size(-2)
        return self.k[..., -n:, :], self.v[..., -n:, :]


class RollingKVCacheList(RollingKVCache):
    def __init__(self, window):
        super().__init__(window)
        self.keys, self.values = [], []   # one (B, H, hd) tensor per token, never dropped

    def append(self, k, v):
        before = min(self.seen, self.window - 1)
        self.keys.extend(k.unbind(-2))
        self.values.extend(v.unbind(-2))
        self.seen += k.size(-2)
        n = before + k.size(-2)
        return torch.stack(self.keys[-n:], dim=-2), torch.stack(self.values[-n:], dim=-2)


BUGS = {
    "window-off-by-one": [{"sliding_window_mask": mask_window_plus_one,
                           "sliding_window_attention": attention_window_plus_one},
                          {"sliding_window_mask": mask_window_minus_one,
                           "sliding_window_attention": attention_window_minus_one}],
    "window-not-causal": [{"sliding_window_mask": mask_symmetric, "sliding_window_attention": attention_symmetric},
                          {"sliding_window_mask": mask_no_causal_bound,
                           "sliding_window_attention": attention_no_causal_bound}],
    "mask-top-left-aligned": {"sliding_window_mask": mask_top_left, "sliding_window_attention": attention_top_left},
    "no-scaling": {"sliding_window_attention": attention_no_scaling},
    "double-scale": {"sliding_window_attention": attention_double_scale},
    "softmax-wrong-dim": {"sliding_window_attention": attention_softmax_wrong_dim},
    "rolling-buffer-order": [{"RollingKVCache": RollingKVCacheSlotOrder},
                             {"RollingKVCache": RollingKVCacheSlotOrderCut},
                             {"RollingKVCache": RollingKVCacheWholeBuffer},
                             {"RollingKVCache": RollingKVCacheBufferNewestFirst},
                             {"RollingKVCache": RollingKVCacheNewestFirst}],
    "rolling-buffer-overwritten": [{"RollingKVCache": RollingKVCacheWritesFirst},
                                   {"RollingKVCache": RollingKVCachePushesFirst}],
    "rolling-buffer-grows": [{"RollingKVCache": RollingKVCacheConcat}, {"RollingKVCache": RollingKVCacheList}],
    "banned-api": {"sliding_window_attention": attention_banned},
}
