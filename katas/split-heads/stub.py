import torch


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, C) -> (B, n_heads, T, C // n_heads): head ``h`` owns channels ``h*hd`` to ``(h+1)*hd``.

    Raises ValueError, naming C and n_heads, when ``n_heads`` does not divide C.
    """
    raise NotImplementedError("write split_heads")


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, n_heads, T, hd) -> (B, T, n_heads * hd), the inverse of ``split_heads``, whatever the strides of ``x``."""
    raise NotImplementedError("write merge_heads")
