"""An arange-broadcast mask and einsum attention, with a fixed buffer of `window` slots that the
new tokens are scattered into at `position % window`; append hands attention everything the buffer
holds, slot 0 first, and the chunk after it, trusting the band mask to drop the oldest. Slot 0
first is oldest first only until the buffer wraps (rolling-buffer-order)."""
import math

import torch


def sliding_window_mask(Tq, Tk, window, device=None):
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if Tq > Tk:
        raise ValueError(f"Tq={Tq} queries cannot be the last of Tk={Tk} keys")
    back = torch.arange(Tk - Tq, Tk, device=device).unsqueeze(1) - torch.arange(Tk, device=device).unsqueeze(0)
    return (0 <= back) & (back < window)


def sliding_window_attention(q, k, v, window):
    allowed = sliding_window_mask(q.shape[-2], k.shape[-2], window, q.device)
    scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
    scores = torch.where(allowed, scores, torch.tensor(float("-inf"), dtype=scores.dtype, device=scores.device))
    return torch.einsum("...qk,...kd->...qd", torch.softmax(scores, dim=-1), v)


class RollingKVCache:
    def __init__(self, window):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window, self.t = window, 0
        self.k_buf = self.v_buf = None

    def __len__(self):
        return self.t

    def append(self, k, v):
        n = k.shape[2]
        if self.k_buf is None:
            self.k_buf = torch.zeros(*k.shape[:2], self.window, k.shape[3], dtype=k.dtype, device=k.device)
            self.v_buf = torch.zeros(*v.shape[:2], self.window, v.shape[3], dtype=v.dtype, device=v.device)
        used = min(self.t, self.window)
        k_win = torch.cat([self.k_buf[:, :, :used], k], dim=2)
        v_win = torch.cat([self.v_buf[:, :, :used], v], dim=2)
        positions = torch.arange(self.t, self.t + n, device=k.device)[-self.window:]
        slots = (positions % self.window)[None, None, :, None]
        self.k_buf.scatter_(2, slots.expand(*k.shape[:2], -1, k.shape[3]), k[:, :, -self.window:])
        self.v_buf.scatter_(2, slots.expand(*v.shape[:2], -1, v.shape[3]), v[:, :, -self.window:])
        self.t += n
        return k_win, v_win
