"""The causal-mask grader's expected masks, written apart from the reference.

They are answers as much as the reference is, so they stay out of student bundles with it: the
grader asks for them as ``bugs.expected``, which a bundle replays from its recordings.
"""
import torch


def lower_triangle(t):
    """Query i sees keys 0..i, itself included: (T, T) bool."""
    return torch.ones(t, t, dtype=torch.bool).tril()


def bottom_right(tq, tk):
    """Query i sits at absolute position tk - tq + i and sees the keys at or before it: (Tq, Tk) bool."""
    return torch.arange(tk)[None, :] <= (tk - tq + torch.arange(tq))[:, None]


def padding(lengths, max_len):
    """True at the first lengths[b] positions of sequence b: (B, 1, 1, max_len) bool."""
    return torch.tensor([[[[p < n for p in range(max_len)]]] for n in lengths.tolist()])
