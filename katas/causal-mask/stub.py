import torch


def causal_mask(n_queries: int, n_keys: int | None = None, device=None) -> torch.Tensor:
    """Bool ``(n_queries, n_keys)`` mask on ``device``; True = this query may attend to this key.

    ``n_keys`` defaults to ``n_queries``. Bottom-right aligned: query ``i`` sits at absolute
    position ``n_keys - n_queries + i`` and may attend to every key at or before that position
    (the queries are the last ``n_queries`` tokens, as in KV-cache decoding).
    """
    raise NotImplementedError("write causal_mask")


def padding_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """Bool ``(B, 1, 1, max_len)`` key mask on ``lengths.device``: True where ``position < lengths[b]``.

    ``lengths`` is a ``(B,)`` integer tensor of the real (unpadded) lengths; the singleton axes
    broadcast over heads and queries.
    """
    raise NotImplementedError("write padding_mask")


def masked_attention(q, k, v, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention with an optional bool mask; returns ``(out, weights)``.

    q ``(..., Tq, d)``, k ``(..., Tk, d)``, v ``(..., Tk, dv)``; ``mask`` broadcastable to
    ``(..., Tq, Tk)``, True = may attend. out is ``(..., Tq, dv)``, weights ``(..., Tq, Tk)``.
    A query with no allowed key gets all-zero weights and a zero output, never NaN.
    """
    raise NotImplementedError("write masked_attention")
