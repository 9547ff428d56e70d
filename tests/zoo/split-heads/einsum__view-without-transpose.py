"""The einsum idiom with the heads split out of the channels time-first: `x.reshape(B, n_heads, T, hd)`
and an identity einsum, which keeps the (B, T, C) memory order.
"""
import torch


def split_heads(x, n_heads):
    B, T, C = x.shape
    if C % n_heads:
        raise ValueError(f"C ({C}) must be divisible by n_heads ({n_heads})")
    return torch.einsum("bhtd->bhtd", x.reshape(B, n_heads, T, C // n_heads))


def merge_heads(x):
    B, H, T, hd = x.shape
    return torch.einsum("bhtd->bthd", x).reshape(B, T, H * hd)
