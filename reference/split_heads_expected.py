"""The split-heads grader's expected values, by slicing and concatenating the channel blocks of
each head, apart from the reference's view and transpose.

They are answers as much as the reference is, so they stay out of student bundles with it: the
grader asks for them as ``bugs.expected``, which a bundle replays from its recordings.
"""
import torch


def split(x, H):
    """Head h of token t is the channel block x[b, t, h*hd:(h+1)*hd]: (B, H, T, hd)."""
    hd = x.shape[-1] // H
    return torch.stack([x[..., h * hd:(h + 1) * hd] for h in range(H)], dim=1)   # (B, H, T, hd)


def merge(y):
    """Head h goes back to channels h*hd:(h+1)*hd: the heads side by side along the channels."""
    return torch.cat(y.unbind(dim=1), dim=-1)   # (B, T, H * hd)
