"""Sliding-window attention and Mistral's rolling KV cache (katas/sliding-window/README.md).

Masks follow F.scaled_dot_product_attention: True = this query may attend to this key.
"""
import math

import torch


def sliding_window_mask(Tq: int, Tk: int, window: int, device=None) -> torch.Tensor:
    """Bool ``(Tq, Tk)`` mask on ``device``; True = this query may attend to this key.

    Bottom-right aligned: the queries are the last ``Tq`` of the ``Tk`` tokens, so query ``i``
    sits at position ``p = Tk - Tq + i`` and may attend to key ``j`` iff ``0 <= p - j < window``:
    itself and the ``window - 1`` keys before it. ``window >= Tk`` is the causal mask.
    Raises ValueError when ``window < 1`` or ``Tq > Tk``.
    """
    if window < 1:
        raise ValueError(f"window must be at least 1 (a query always sees itself), got {window}")
    if Tq > Tk:
        raise ValueError(f"Tq ({Tq}) > Tk ({Tk}): the queries are the last Tq of the Tk tokens")
    # Built on `device` directly: no CPU mask copied over at every decoding step.
    positions = torch.arange(Tk - Tq, Tk, device=device)   # (Tq,) where each query sits
    back = positions[:, None] - torch.arange(Tk, device=device)[None, :]   # (Tq, Tk) how far back key j lies
    return (back >= 0) & (back < window)   # (Tq, Tk): no future key, none window or more behind


def sliding_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """Scaled dot-product attention under ``sliding_window_mask(Tq, Tk, window)``.

    q ``(B, H, Tq, hd)``, k ``(B, H, Tk, hd)``, v ``(B, H, Tk, dv)`` -> out ``(B, H, Tq, dv)``, in
    q's dtype, scaled by ``1/sqrt(hd)``. The queries are the last ``Tq`` tokens (``Tq <= Tk``), so
    every query sees at least itself.
    """
    allowed = sliding_window_mask(q.size(-2), k.size(-2), window, device=q.device)   # (Tq, Tk)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))   # (B, H, Tq, Tk)
    scores = scores.masked_fill(~allowed, float("-inf"))   # (B, H, Tq, Tk)
    return torch.softmax(scores, dim=-1) @ v   # (B, H, Tq, dv)


class RollingKVCache:
    """Mistral's rotating KV cache: a fixed buffer of ``window`` tokens per tensor, in which the
    token at position ``p`` lives in slot ``p % window``, overwriting the token ``window`` before it.

    ``append(k, v)`` takes the next ``t_new >= 1`` tokens, k ``(B, H, t_new, hd)`` and v
    ``(B, H, t_new, dv)``, and returns ``(k_win, v_win)``: the keys and values the new tokens'
    queries may attend to, in chronological order, i.e. the ``window - 1`` tokens before the chunk
    (as many as there are) followed by the chunk itself, ``(B, H, min(t, window - 1 + t_new), hd)``
    with ``t`` the tokens seen so far. ``len(cache)`` is ``t``. Raises ValueError when ``window < 1``.
    """

    def __init__(self, window: int):
        """An empty cache for a sliding window of ``window`` tokens."""
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.window = window
        self.k = self.v = None   # (B, H, window, hd) and (B, H, window, dv) from the first append
        self.seen = 0   # tokens appended so far

    def __len__(self) -> int:
        """The number of tokens appended so far (not the number the buffer holds)."""
        return self.seen

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the next tokens; return the keys and values their queries may attend to, oldest first."""
        t_new = k.size(-2)
        if self.k is None:
            # Allocated once at full size: the buffer never grows, however long the stream.
            self.k = k.new_zeros(*k.shape[:-2], self.window, k.size(-1))   # (B, H, W, hd)
            self.v = v.new_zeros(*v.shape[:-2], self.window, v.size(-1))   # (B, H, W, dv)
        # The chunk's first query sees the window - 1 tokens before it: read them before the
        # chunk's own tokens overwrite their slots.
        before = min(self.seen, self.window - 1)
        k_win = torch.cat([self._last(self.k, before), k], dim=-2)   # (B, H, before + t_new, hd)
        v_win = torch.cat([self._last(self.v, before), v], dim=-2)   # (B, H, before + t_new, dv)
        # Only the chunk's last `window` tokens can ever be seen again.
        kept = min(t_new, self.window)
        slots = torch.arange(self.seen + t_new - kept, self.seen + t_new, device=k.device) % self.window   # (kept,)
        self.k[..., slots, :] = k[..., t_new - kept:, :]
        self.v[..., slots, :] = v[..., t_new - kept:, :]
        self.seen += t_new
        return k_win, v_win

    def _last(self, buffer: torch.Tensor, n: int) -> torch.Tensor:
        """The last ``n`` tokens the buffer holds, unrotated: oldest first."""
        slots = torch.arange(self.seen - n, self.seen, device=buffer.device) % self.window   # (n,)
        return buffer[..., slots, :]   # (B, H, n, hd)
