import math

import torch
import triton
import triton.language as tl


@triton.jit
def _flash_fwd_kernel(Q, K, V, Out, Lse, stride_b, stride_h, stride_t, H, T, sm_scale,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """One program: the BLOCK_M queries of block tl.program_id(0) of (batch, head) tl.program_id(1)
    against the key blocks they see; writes their rows of Out and Lse."""
    pass


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, BLOCK_M: int = 16,
                    BLOCK_N: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ / sqrt(D)) v by a Triton kernel, one (BLOCK_M, BLOCK_N) block of scores at a time.

    q, k, v ``(B, H, T, D)`` contiguous, float32 or float16, D a power of two. Returns ``(out, lse)``:
    out ``(B, H, T, D)`` in q's dtype, and lse ``(B, H, T)`` float32, the natural log of the sum of
    exp(score) over the keys each query attends to. ``causal``: query i attends to keys 0 .. i, and
    the key blocks above the diagonal are skipped. One program per (query block, batch·head): grid
    ``(cdiv(T, BLOCK_M), B * H)``; BLOCK_M and BLOCK_N powers of two, BLOCK_M a multiple of BLOCK_N.
    """
    raise NotImplementedError("write flash_attention and its kernel")
