"""The doc-masking grader's expected ids, positions and masks, written apart from the reference.

Plain Python loops over the documents' (start, end) pairs, no tensor tricks. They are answers as much
as the reference is, so they stay out of student bundles with it: the grader asks for them as
``bugs.expected``, which a bundle replays from its recordings.
"""
import torch


def _documents(cu_seqlens):
    """[(start, end)] of every document, empty ones included: document d holds tokens start..end-1."""
    cu = [int(c) for c in cu_seqlens.tolist()]
    return list(zip(cu[:-1], cu[1:]))


def ids(cu_seqlens):
    """int64 (T,): document d repeated once per token it holds."""
    return torch.tensor([d for d, (start, end) in enumerate(_documents(cu_seqlens)) for _ in range(start, end)],
                        dtype=torch.int64)


def positions(cu_seqlens):
    """int64 (T,): 0, 1, .. inside each document."""
    return torch.tensor([t - start for start, end in _documents(cu_seqlens) for t in range(start, end)],
                        dtype=torch.int64)


def mask(cu_seqlens, prefix_lens=None):
    """bool (T, T): inside each document, key j at or before query i, or j in the document's prefix."""
    T = int(cu_seqlens[-1])
    out = torch.zeros(T, T, dtype=torch.bool)
    for d, (start, end) in enumerate(_documents(cu_seqlens)):
        prefix = 0 if prefix_lens is None else int(prefix_lens[d])
        for i in range(start, end):
            for j in range(start, end):
                out[i, j] = j <= i or j - start < prefix
    return out
