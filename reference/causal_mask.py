"""Causal and padding masks, and attention that honours them (katas/causal-mask/README.md).

Masks follow F.scaled_dot_product_attention: True = this query may attend to this key.
"""
import math

import torch


def causal_mask(n_queries: int, n_keys: int | None = None, device=None) -> torch.Tensor:
    """Bool ``(n_queries, n_keys)`` mask on ``device``; True = this query may attend to this key.

    ``n_keys`` defaults to ``n_queries``. Bottom-right aligned: query ``i`` sits at absolute
    position ``n_keys - n_queries + i`` and may attend to every key at or before that position
    (the queries are the last ``n_queries`` tokens, as in KV-cache decoding).
    """
    n_keys = n_queries if n_keys is None else n_keys
    # tril's offset moves the diagonal right by the n_keys - n_queries earlier (cached) keys, so the
    # last query sees every key. Built on `device` directly: no CPU mask copied over at every step.
    ones = torch.ones(n_queries, n_keys, dtype=torch.bool, device=device)   # (Tq, Tk)
    return ones.tril(n_keys - n_queries)   # (Tq, Tk)


def padding_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """Bool ``(B, 1, 1, max_len)`` key mask on ``lengths.device``: True where ``position < lengths[b]``.

    ``lengths`` is a ``(B,)`` integer tensor of the real (unpadded) lengths; the singleton axes
    broadcast over heads and queries.
    """
    positions = torch.arange(max_len, device=lengths.device)   # (T,)
    return (positions < lengths[:, None])[:, None, None, :]   # (B, 1, 1, T)


def masked_attention(q, k, v, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention with an optional bool mask; returns ``(out, weights)``.

    q ``(..., Tq, d)``, k ``(..., Tk, d)``, v ``(..., Tk, dv)``; ``mask`` broadcastable to
    ``(..., Tq, Tk)``, True = may attend. out is ``(..., Tq, dv)``, weights ``(..., Tq, Tk)``.
    A query with no allowed key gets all-zero weights and a zero output, never NaN.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))   # (..., Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))   # (..., Tq, Tk)
    weights = torch.softmax(scores, dim=-1)   # (..., Tq, Tk); an all -inf row is 0/0 = NaN
    if mask is not None:
        # masked_fill, not multiplication: NaN * 0 is still NaN.
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)   # (..., Tq, Tk)
    return weights @ v, weights   # (..., Tq, dv), (..., Tq, Tk)
