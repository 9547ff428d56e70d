import math

import torch


def sliding_window_mask(Tq: int, Tk: int, window: int, device=None) -> torch.Tensor:
    """Bool ``(Tq, Tk)`` mask on ``device``; True = this query may attend to this key.

    Bottom-right aligned: the queries are the last ``Tq`` of the ``Tk`` tokens, so query ``i``
    sits at position ``p = Tk - Tq + i`` and may attend to key ``j`` iff ``0 <= p - j < window``:
    itself and the ``window - 1`` keys before it. ``window >= Tk`` is the causal mask.
    Raises ValueError when ``window < 1`` or ``Tq > Tk``.
    """
    raise NotImplementedError("write sliding_window_mask")


def sliding_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """Scaled dot-product attention under ``sliding_window_mask(Tq, Tk, window)``.

    q ``(B, H, Tq, hd)``, k ``(B, H, Tk, hd)``, v ``(B, H, Tk, dv)`` -> out ``(B, H, Tq, dv)``, in
    q's dtype, scaled by ``1/sqrt(hd)``. The queries are the last ``Tq`` tokens (``Tq <= Tk``), so
    every query sees at least itself.
    """
    raise NotImplementedError("write sliding_window_attention")


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
        # the buffers can only be allocated at the first append, when B, H, hd, dtype and device are known
        raise NotImplementedError("write RollingKVCache.__init__")

    def __len__(self) -> int:
        """The number of tokens appended so far (not the number the buffer holds)."""
        raise NotImplementedError("write RollingKVCache.__len__")

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the next tokens; return the keys and values their queries may attend to, oldest first."""
        raise NotImplementedError("write RollingKVCache.append")
