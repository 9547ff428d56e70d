"""Packed documents: document masks, positions that restart, and attention over a packed row.

Several documents are packed into one row of T tokens, described by ``cu_seqlens``: the cumulative
lengths ``[0, n_0, n_0 + n_1, ..., T]`` (an integer tensor of n_docs + 1 entries, as varlen kernels
take it); document d holds tokens ``cu_seqlens[d] .. cu_seqlens[d + 1] - 1``. Masks follow
F.scaled_dot_product_attention: True = this query may attend to this key.
"""
import torch


def document_ids(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """int64 ``(T,)`` on ``cu_seqlens.device``: the document each token of the packed row belongs to.

    ``T = cu_seqlens[-1]``. Empty documents (two equal entries in ``cu_seqlens``) own no token.
    """
    raise NotImplementedError("write document_ids")


def position_ids(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """int64 ``(T,)`` on ``cu_seqlens.device``: each token's position inside its own document.

    Positions restart at 0 at the first token of every document: ``[0, 1, .., n_0 - 1, 0, 1, ..]``.
    """
    raise NotImplementedError("write position_ids")


def document_mask(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Bool ``(T, T)`` on ``cu_seqlens.device``, True = may attend: block-diagonal causal.

    Query i may attend to key j when both belong to the same document and ``j <= i``: each
    document is its own causal triangle, and no token sees another document.
    """
    raise NotImplementedError("write document_mask")


def prefix_lm_mask(cu_seqlens: torch.Tensor, prefix_lens: torch.Tensor) -> torch.Tensor:
    """Bool ``(T, T)`` on ``cu_seqlens.device``, True = may attend: a prefix-LM mask per document.

    ``prefix_lens`` is an integer ``(n_docs,)`` tensor: the first ``prefix_lens[d]`` tokens of
    document d are its prefix (a prefix longer than the document covers all of it). Inside a
    document, every token may attend to the whole prefix (so the prefix is bidirectional), and a
    token after the prefix also to the tokens before it and itself (causal). Never across documents.
    """
    raise NotImplementedError("write prefix_lm_mask")


def packed_attention(q, k, v, cu_seqlens: torch.Tensor, prefix_lens: torch.Tensor | None = None):
    """Attention over a packed row, equal to attending to each document on its own.

    q ``(..., T, d)``, k ``(..., T, d)``, v ``(..., T, dv)`` with ``T = cu_seqlens[-1]``; leading
    axes (batch of one, heads) broadcast. Causal inside each document, or the prefix-LM mask when
    ``prefix_lens`` is given. Scale ``1/sqrt(d)``. Returns out ``(..., T, dv)``.
    """
    raise NotImplementedError("write packed_attention")
