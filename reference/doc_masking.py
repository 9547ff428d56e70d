"""Packed documents: document masks, restarting positions and packed attention (katas/doc-masking/README.md).

Several documents are packed into one row of T tokens, described by ``cu_seqlens``: the cumulative
lengths ``[0, n_0, n_0 + n_1, ..., T]`` (an integer tensor of n_docs + 1 entries, as varlen kernels
take it); document d holds tokens ``cu_seqlens[d] .. cu_seqlens[d + 1] - 1``. Masks follow
F.scaled_dot_product_attention: True = this query may attend to this key.
"""
import math

import torch


def document_ids(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """int64 ``(T,)`` on ``cu_seqlens.device``: the document each token of the packed row belongs to.

    ``T = cu_seqlens[-1]``. Empty documents (two equal entries in ``cu_seqlens``) own no token.
    """
    seqlens = cu_seqlens[1:] - cu_seqlens[:-1]   # (n_docs,)
    docs = torch.arange(len(seqlens), device=cu_seqlens.device)   # (n_docs,)
    return torch.repeat_interleave(docs, seqlens)   # (T,)


def position_ids(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """int64 ``(T,)`` on ``cu_seqlens.device``: each token's position inside its own document.

    Positions restart at 0 at the first token of every document: ``[0, 1, .., n_0 - 1, 0, 1, ..]``.
    """
    docs = document_ids(cu_seqlens)   # (T,)
    tokens = torch.arange(len(docs), device=cu_seqlens.device)   # (T,)
    return tokens - cu_seqlens.long()[docs]   # (T,) token index minus its document's first token


def document_mask(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Bool ``(T, T)`` on ``cu_seqlens.device``, True = may attend: block-diagonal causal.

    Query i may attend to key j when both belong to the same document and ``j <= i``: each
    document is its own causal triangle, and no token sees another document.
    """
    docs = document_ids(cu_seqlens)   # (T,)
    same_doc = docs[:, None] == docs[None, :]   # (T, T)
    tokens = torch.arange(len(docs), device=cu_seqlens.device)   # (T,)
    causal = tokens[None, :] <= tokens[:, None]   # (T, T): key j at or before query i
    return same_doc & causal   # (T, T)


def prefix_lm_mask(cu_seqlens: torch.Tensor, prefix_lens: torch.Tensor) -> torch.Tensor:
    """Bool ``(T, T)`` on ``cu_seqlens.device``, True = may attend: a prefix-LM mask per document.

    ``prefix_lens`` is an integer ``(n_docs,)`` tensor: the first ``prefix_lens[d]`` tokens of
    document d are its prefix (a prefix longer than the document covers all of it). Inside a
    document, every token may attend to the whole prefix (so the prefix is bidirectional), and a
    token after the prefix also to the tokens before it and itself (causal). Never across documents.
    """
    docs = document_ids(cu_seqlens)   # (T,)
    pos = position_ids(cu_seqlens)   # (T,) position inside the document
    same_doc = docs[:, None] == docs[None, :]   # (T, T)
    causal = pos[None, :] <= pos[:, None]   # (T, T), only meaningful inside a document
    key_in_prefix = pos < prefix_lens.to(cu_seqlens.device).long()[docs]   # (T,)
    return same_doc & (causal | key_in_prefix[None, :])   # (T, T)


def packed_attention(q, k, v, cu_seqlens: torch.Tensor, prefix_lens: torch.Tensor | None = None):
    """Attention over a packed row, equal to attending to each document on its own.

    q ``(..., T, d)``, k ``(..., T, d)``, v ``(..., T, dv)`` with ``T = cu_seqlens[-1]``; leading
    axes (batch of one, heads) broadcast. Causal inside each document, or the prefix-LM mask when
    ``prefix_lens`` is given. Scale ``1/sqrt(d)``. Returns out ``(..., T, dv)``.
    """
    if prefix_lens is None:
        mask = document_mask(cu_seqlens)   # (T, T)
    else:
        mask = prefix_lm_mask(cu_seqlens, prefix_lens)   # (T, T)
    mask = mask.to(q.device)   # (T, T)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))   # (..., T, T)
    scores = scores.masked_fill(~mask, float("-inf"))   # (..., T, T)
    weights = torch.softmax(scores, dim=-1)   # (..., T, T); every token sees itself: no empty row
    return weights @ v   # (..., T, dv)
