"""The sliding-window grader's expected masks, written out entry by entry, apart from the reference.

They are answers as much as the reference is, so they stay out of student bundles with it: the
grader asks for them as ``bugs.expected``, which a bundle replays from its recordings.
"""
import torch


def band(Tq, Tk, window):
    """Query i sits at Tk - Tq + i and sees key j iff 0 <= its distance back < window: (Tq, Tk) bool."""
    return torch.tensor([[0 <= (Tk - Tq + i) - j < window for j in range(Tk)] for i in range(Tq)], dtype=torch.bool)


def causal(Tq, Tk):
    """The bottom-right aligned causal mask (query i at Tk - Tq + i sees every key up to it): (Tq, Tk) bool."""
    return torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)


def wrong_masks(Tq, Tk, window):
    """The masks of the bugs the grader names from a mask's pattern, (Tq, Tk) bool each: the future
    keys, the band one key narrower and one key wider, and the band with query i at position i
    (SDPA's is_causal alignment)."""
    top_left = torch.tensor([[0 <= i - j < window for j in range(Tk)] for i in range(Tq)], dtype=torch.bool)
    return ~causal(Tq, Tk), band(Tq, Tk, window - 1), band(Tq, Tk, window + 1), top_left
