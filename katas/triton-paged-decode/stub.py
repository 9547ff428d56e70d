import math

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr,
    stride_qb, stride_qh, stride_qd,
    stride_kn, stride_ks, stride_kh, stride_kd,   # k cache: block, slot in the block, head, channel
    stride_vn, stride_vs, stride_vh, stride_vd,
    stride_tb, stride_tn,
    stride_ob, stride_oh, stride_od,
    scale,
    G: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    """One program per (sequence, KV head): the G query heads of the group, online softmax over
    the sequence's blocks, each looked up in its row of the block table; the last block masked by
    seq_len. Write your kernel here (or change its arguments: the launcher is yours too)."""
    pass


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_table: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """One decoding step of attention over a paged KV cache, in one Triton kernel.

    q (B, Hq, D): each sequence's new token's queries. k_cache, v_cache (num_blocks, block_size,
    Hkv, D): the pool of blocks (FlashAttention's paged layout, any strides). block_table
    (B, max_blocks) int32: row b lists sequence b's physical block ids, logical block 0 first.
    seq_lens (B,) int32: the tokens cached for each sequence (>= 1, the new token's included).
    Hq = G * Hkv, query head j reads KV head j // G; block_size and D are powers of two.
    Returns out (B, Hq, D) in q's dtype: softmax(q k^T / sqrt(D)) v over each sequence's tokens.
    """
    raise NotImplementedError("write paged_decode and its kernel")
