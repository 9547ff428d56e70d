"""FlashAttention's forward pass in PyTorch: attention one tile of scores at a time, with an online
softmax, so that the (Tq, Tk) score matrix is never built."""
import math

import torch


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_q: int = 64, block_k: int = 64,
                    causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ / sqrt(head_dim)) v, computed one (block_q, block_k) tile of scores at a time.

    q ``(B, H, Tq, head_dim)``, k and v ``(B, H, Tk, head_dim)``. Returns ``(out, lse)``: out
    ``(B, H, Tq, head_dim)`` and lse ``(B, H, Tq)``, the natural log of the sum of exp(score) over
    the keys each query may attend to, both in q's dtype. ``causal`` is bottom-right aligned:
    query i sits at position Tk - Tq + i and attends to keys 0 .. Tk - Tq + i; key blocks that
    lie entirely after a query block's last position are skipped, not masked. Raises ValueError
    when a block size is below 1, or when ``causal`` and Tq > Tk (the first queries would see no key).
    """
    # a loop over query blocks, inside it a loop over key blocks; `kata hint flash-tiling` when stuck
    raise NotImplementedError("write flash_attention")
