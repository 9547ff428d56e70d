"""Reference of the triton-paged-decode kata: one decoding step of attention over a paged KV cache,
read through the block table inside a Triton kernel.

The cache is a pool of fixed-size blocks, and each sequence's tokens sit in the blocks its row of
the block table names (vLLM's PagedAttention, Kwon et al. 2023; FlashAttention's
``flash_attn_with_kvcache(..., block_table=...)``). The layout is FlashAttention's paged one:
k_cache and v_cache (num_blocks, block_size, n_kv_heads, head_dim). The kernel looks up each
logical block's physical id and loads its keys where they are: no contiguous copy is ever made.
One program per (sequence, KV head) holds the G query heads that share that KV head as the rows of
one block, so each cached key and value is read once per step, not once per query head (vLLM's
grouped Triton decode kernel does the same with its BLOCK_H rows).
"""
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
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    offs_g = tl.arange(0, BLOCK_G)   # (BLOCK_G,) the group's query heads, padded to a power of two
    offs_s = tl.arange(0, BLOCK_SIZE)   # (BLOCK_SIZE,) slots of one block
    offs_d = tl.arange(0, HEAD_DIM)   # (HEAD_DIM,)
    in_group = offs_g < G
    heads = kv_head * G + offs_g   # query head j reads KV head j // G

    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=in_group[:, None], other=0.0).to(tl.float32)   # (BLOCK_G, HEAD_DIM)
    q = q * scale   # scaled once here, not each score
    seq_len = tl.load(lens_ptr + seq)

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)   # (BLOCK_G,) running max of the scores
    l = tl.zeros([BLOCK_G], tl.float32)   # (BLOCK_G,) running sum of exp(score - m)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)   # (BLOCK_G, HEAD_DIM) running sum of p @ v
    for j in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):   # the sequence's logical blocks
        block = tl.load(table_ptr + seq * stride_tb + j * stride_tn)   # its physical block id
        valid = j * BLOCK_SIZE + offs_s < seq_len   # (BLOCK_SIZE,) the last block may be partial
        k = tl.load(k_ptr + block * stride_kn + offs_s[:, None] * stride_ks + kv_head * stride_kh
                    + offs_d[None, :] * stride_kd, mask=valid[:, None], other=0.0)   # (BLOCK_SIZE, HEAD_DIM)
        v = tl.load(v_ptr + block * stride_vn + offs_s[:, None] * stride_vs + kv_head * stride_vh
                    + offs_d[None, :] * stride_vd, mask=valid[:, None], other=0.0)   # (BLOCK_SIZE, HEAD_DIM)

        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)   # (BLOCK_G, BLOCK_SIZE) every head of the group
        s = tl.where(valid[None, :], s, float("-inf"))   # slots past seq_len hold no token
        m_new = tl.maximum(m, tl.max(s, axis=1))   # (BLOCK_G,) finite: every block has a valid slot
        alpha = tl.exp(m - m_new)   # (BLOCK_G,) rescales what was summed under the old max
        p = tl.exp(s - m_new[:, None])   # (BLOCK_G, BLOCK_SIZE)
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)   # (BLOCK_G, HEAD_DIM)
        m = m_new

    out = acc / l[:, None]   # (BLOCK_G, HEAD_DIM)
    tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + offs_d[None, :] * stride_od,
             out.to(out_ptr.dtype.element_ty), mask=in_group[:, None])


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
    B, Hq, D = q.shape
    num_blocks, block_size, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    out = torch.empty_like(q)   # (B, Hq, D)
    # One program per (sequence, KV head): the group's G query heads share every key it loads.
    _paged_decode_kernel[(B, Hkv)](
        q, k_cache, v_cache, block_table, seq_lens, out,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.stride(3),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), v_cache.stride(3),
        block_table.stride(0), block_table.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        1.0 / math.sqrt(D),
        G=G, BLOCK_G=triton.next_power_of_2(G), BLOCK_SIZE=block_size, HEAD_DIM=D,
    )
    return out
