"""The arange mask and rolling buffer, with the einsum's scores divided by the head width itself,
`/ q.shape[-1]`, where it is its square root that keeps them at unit variance (double-scale)."""
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
    scores = torch.einsum("...qd,...kd->...qk", q, k) / q.shape[-1]
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
        before = min(self.t, self.window - 1)
        k_win = torch.cat([self.k_buf[:, :, self.window - before:], k], dim=2)
        v_win = torch.cat([self.v_buf[:, :, self.window - before:], v], dim=2)
        kept = min(n, self.window)
        self.k_buf = torch.roll(self.k_buf, -kept, dims=2)
        self.v_buf = torch.roll(self.v_buf, -kept, dims=2)
        self.k_buf[:, :, self.window - kept:] = k[:, :, n - kept:]
        self.v_buf[:, :, self.window - kept:] = v[:, :, n - kept:]
        self.t += n
        return k_win, v_win
