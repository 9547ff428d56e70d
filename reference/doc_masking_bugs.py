"""Known doc-masking bugs, each a complete function with exactly that mistake."""
import math

import torch
import torch.nn.functional as F


def _ids(cu_seqlens):
    seqlens = cu_seqlens[1:] - cu_seqlens[:-1]
    return torch.repeat_interleave(torch.arange(len(seqlens), device=cu_seqlens.device), seqlens)


def _positions(cu_seqlens):
    docs = _ids(cu_seqlens)
    return torch.arange(len(docs), device=cu_seqlens.device) - cu_seqlens.long()[docs]


def _attend(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    scores = scores.masked_fill(~mask.to(q.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


# documents-see-each-other -------------------------------------------------------------------------

def document_mask_plain_causal(cu_seqlens):
    T = int(cu_seqlens[-1])
    return torch.ones(T, T, dtype=torch.bool, device=cu_seqlens.device).tril()   # cu_seqlens unused


def document_mask_from_positions(cu_seqlens):
    pos = _positions(cu_seqlens)
    return pos[None, :] <= pos[:, None]   # causal on restarted positions, no same-document test


def prefix_lm_mask_prefix_shared(cu_seqlens, prefix_lens):
    docs, pos = _ids(cu_seqlens), _positions(cu_seqlens)
    same_doc = docs[:, None] == docs[None, :]
    key_in_prefix = pos < prefix_lens.to(cu_seqlens.device).long()[docs]
    return (same_doc & (pos[None, :] <= pos[:, None])) | key_in_prefix[None, :]   # prefixes seen by all


def packed_attention_one_causal_row(q, k, v, cu_seqlens, prefix_lens=None):
    T = q.size(-2)
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()   # the whole row as one sequence
    if prefix_lens is not None:
        docs, pos = _ids(cu_seqlens), _positions(cu_seqlens)
        key_in_prefix = pos < prefix_lens.to(cu_seqlens.device).long()[docs]
        mask = mask | ((docs[:, None] == docs[None, :]) & key_in_prefix[None, :]).to(q.device)
    return _attend(q, k, v, mask)


# positions-not-reset ------------------------------------------------------------------------------

def position_ids_arange(cu_seqlens):
    return torch.arange(int(cu_seqlens[-1]), device=cu_seqlens.device)   # counts across the whole row


def position_ids_from_row_start(cu_seqlens):
    tokens = torch.arange(int(cu_seqlens[-1]), device=cu_seqlens.device)
    return tokens - cu_seqlens.long()[0]   # subtracts the row's start, not each document's


# causal-over-prefix -------------------------------------------------------------------------------

def prefix_lm_mask_causal(cu_seqlens, prefix_lens):
    docs, pos = _ids(cu_seqlens), _positions(cu_seqlens)
    return (docs[:, None] == docs[None, :]) & (pos[None, :] <= pos[:, None])   # prefix_lens ignored


def prefix_lm_mask_prefix_from_row_start(cu_seqlens, prefix_lens):
    docs = _ids(cu_seqlens)
    tokens = torch.arange(len(docs), device=cu_seqlens.device)
    same_doc = docs[:, None] == docs[None, :]
    causal = tokens[None, :] <= tokens[:, None]
    key_in_prefix = tokens < prefix_lens.to(cu_seqlens.device).long()[docs]   # row position, not the document's
    return same_doc & (causal | key_in_prefix[None, :])


def prefix_lm_mask_causal_then_prefix(cu_seqlens, prefix_lens):
    docs, pos = _ids(cu_seqlens), _positions(cu_seqlens)
    same_doc = docs[:, None] == docs[None, :]
    prefix = prefix_lens.to(cu_seqlens.device).long()[docs]
    # keys of the prefix only for queries after it: the prefix itself stays causal
    return same_doc & ((pos[None, :] <= pos[:, None]) | ((pos[None, :] < prefix) & (pos >= prefix)[:, None]))


def packed_attention_prefix_ignored(q, k, v, cu_seqlens, prefix_lens=None):
    docs, pos = _ids(cu_seqlens), _positions(cu_seqlens)
    return _attend(q, k, v, (docs[:, None] == docs[None, :]) & (pos[None, :] <= pos[:, None]))


# boundary-off-by-one ------------------------------------------------------------------------------

def document_ids_searchsorted_left(cu_seqlens):
    tokens = torch.arange(int(cu_seqlens[-1]), device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].contiguous(), tokens.to(cu_seqlens.dtype))   # right=False: a
    # document's first token goes to the document before


def document_ids_bucketize(cu_seqlens):
    tokens = torch.arange(int(cu_seqlens[-1]), device=cu_seqlens.device)
    return torch.bucketize(tokens.to(cu_seqlens.dtype), cu_seqlens).clamp(min=1) - 1   # ends taken as inclusive


def document_mask_inclusive_end(cu_seqlens):
    T = int(cu_seqlens[-1])
    tokens = torch.arange(T, device=cu_seqlens.device)
    ends = cu_seqlens[1:].long()
    docs = torch.bucketize(tokens, ends.contiguous())   # token == end counted in the document it ends
    same_doc = docs[:, None] == docs[None, :]
    return same_doc & (tokens[None, :] <= tokens[:, None])


def position_ids_first_token_continues(cu_seqlens):
    tokens = torch.arange(int(cu_seqlens[-1]), device=cu_seqlens.device)
    docs = torch.searchsorted(cu_seqlens[1:].contiguous(), tokens.to(cu_seqlens.dtype))   # right=False
    starts = cu_seqlens.long()[docs]
    return tokens - starts   # a document's first token takes the next position of the document before


def packed_attention_inclusive_end(q, k, v, cu_seqlens, prefix_lens=None):
    tokens = torch.arange(q.size(-2), device=cu_seqlens.device)
    docs = torch.bucketize(tokens, cu_seqlens[1:].long().contiguous())   # a boundary token joins the earlier document
    pos = tokens - cu_seqlens.long()[docs]
    allowed = pos[None, :] <= pos[:, None]
    if prefix_lens is not None:
        allowed = allowed | (pos < prefix_lens.to(tokens.device).long()[docs])[None, :]
    return _attend(q, k, v, (docs[:, None] == docs[None, :]) & allowed)


# position-off-by-one ------------------------------------------------------------------------------

def position_ids_from_one(cu_seqlens):
    docs = _ids(cu_seqlens)
    tokens = torch.arange(1, len(docs) + 1, device=cu_seqlens.device)   # counted from 1, not 0
    return tokens - cu_seqlens.long()[docs]   # every document's positions run 1 .. n


# no-scaling, double-scale -------------------------------------------------------------------------

def _packed_mask(cu_seqlens, prefix_lens):
    """The right (T, T) mask: causal inside each document, or its prefix-LM mask."""
    docs, pos = _ids(cu_seqlens), _positions(cu_seqlens)
    allowed = pos[None, :] <= pos[:, None]
    if prefix_lens is not None:
        allowed = allowed | (pos < prefix_lens.to(cu_seqlens.device).long()[docs])[None, :]
    return (docs[:, None] == docs[None, :]) & allowed


def packed_attention_no_scaling(q, k, v, cu_seqlens, prefix_lens=None):
    scores = q @ k.transpose(-2, -1)   # never divided by sqrt(d)
    scores = scores.masked_fill(~_packed_mask(cu_seqlens, prefix_lens).to(q.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def packed_attention_double_scale(q, k, v, cu_seqlens, prefix_lens=None):
    q = q / math.sqrt(q.size(-1))   # q scaled, and _attend scales the scores again: divided by d in all
    return _attend(q, k, v, _packed_mask(cu_seqlens, prefix_lens))


# softmax-wrong-dim --------------------------------------------------------------------------------

def packed_attention_softmax_over_queries(q, k, v, cu_seqlens, prefix_lens=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    scores = scores.masked_fill(~_packed_mask(cu_seqlens, prefix_lens).to(q.device), float("-inf"))
    return torch.softmax(scores, dim=-2) @ v   # over the queries: each key's column sums to 1, no query's row


# banned-api ---------------------------------------------------------------------------------------

def packed_attention_sdpa(q, k, v, cu_seqlens, prefix_lens=None):
    docs, pos = _ids(cu_seqlens), _positions(cu_seqlens)
    allowed = pos[None, :] <= pos[:, None]
    if prefix_lens is not None:
        allowed = allowed | (pos < prefix_lens.to(cu_seqlens.device).long()[docs])[None, :]
    mask = ((docs[:, None] == docs[None, :]) & allowed).to(q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)   # right values, library attention


BUGS = {
    "documents-see-each-other": [{"document_mask": document_mask_plain_causal},
                                 {"document_mask": document_mask_from_positions},
                                 {"prefix_lm_mask": prefix_lm_mask_prefix_shared},
                                 {"packed_attention": packed_attention_one_causal_row}],
    "positions-not-reset": [{"position_ids": position_ids_arange},
                            {"position_ids": position_ids_from_row_start}],
    "causal-over-prefix": [{"prefix_lm_mask": prefix_lm_mask_causal},
                           {"prefix_lm_mask": prefix_lm_mask_prefix_from_row_start},
                           {"prefix_lm_mask": prefix_lm_mask_causal_then_prefix},
                           {"packed_attention": packed_attention_prefix_ignored}],
    "boundary-off-by-one": [{"document_ids": document_ids_searchsorted_left},
                            {"document_ids": document_ids_bucketize},
                            {"document_mask": document_mask_inclusive_end},
                            {"position_ids": position_ids_first_token_continues},
                            {"packed_attention": packed_attention_inclusive_end}],
    "position-off-by-one": {"position_ids": position_ids_from_one},
    "no-scaling": {"packed_attention": packed_attention_no_scaling},
    "double-scale": {"packed_attention": packed_attention_double_scale},
    "softmax-wrong-dim": {"packed_attention": packed_attention_softmax_over_queries},
    "banned-api": {"packed_attention": packed_attention_sdpa},
}
