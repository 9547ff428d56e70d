"""Splitting the channels of a (B, T, C) tensor into attention heads, and merging them back
(katas/split-heads/README.md).

Head h owns the channels h*hd to (h+1)*hd, with hd = C // H: the layout of nanoGPT's attention, of
nn.MultiheadAttention and of every GPT-2 checkpoint.
"""
import torch


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, C) -> (B, n_heads, T, C // n_heads): head ``h`` owns channels ``h*hd`` to ``(h+1)*hd``.

    Raises ValueError, naming C and n_heads, when ``n_heads`` does not divide C.
    """
    B, T, C = x.shape
    if C % n_heads:
        # view would fail too, but with a RuntimeError about sizes that does not say which argument is wrong.
        raise ValueError(f"C = {C} channels cannot be split into n_heads = {n_heads} equal heads")
    # view cuts the channel axis into (H, hd) head-major, in place; the transpose then moves the heads
    # before time. Both only change strides: no data moves.
    return x.view(B, T, n_heads, C // n_heads).transpose(1, 2)   # (B, H, T, hd)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, n_heads, T, hd) -> (B, T, n_heads * hd), the inverse of ``split_heads``, whatever the strides of ``x``."""
    B, H, T, hd = x.shape
    # After the transpose the memory of a contiguous x is not (B, T, C)-ordered, so view would fail:
    # reshape copies when it must and is free when the strides already allow it.
    return x.transpose(1, 2).reshape(B, T, H * hd)   # (B, T, C)
