"""The FlashAttention-style paged kernel with the last block unmasked: every iteration loads a
whole block of keys and values and scores all of it, so the empty slots after seq_len (whatever an
earlier sequence left there) are attended too. Right only when every length is a multiple of the
block size."""
import math

import torch
import triton
import triton.language as tl


@triton.jit
def _fwd_kernel_paged(
    Q, K, V, Out, BlockTable, SeqLens, softmax_scale,
    stride_qb, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vh, stride_vd,
    stride_ob, stride_oh, stride_od,
    stride_btb, stride_btn,
    ngroups,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_HEADDIM: tl.constexpr,
):
    off_b = tl.program_id(0)
    off_hk = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_HEADDIM)
    off_h = off_hk * ngroups + offs_m
    seqlen_k = tl.load(SeqLens + off_b)

    q_ptrs = Q + off_b * stride_qb + off_h[:, None] * stride_qh + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=offs_m[:, None] < ngroups, other=0.0)

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    lse_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc_o = tl.zeros([BLOCK_M, BLOCK_HEADDIM], dtype=tl.float32)
    for start_n in range(0, seqlen_k, BLOCK_N):
        physical = tl.load(BlockTable + off_b * stride_btb + (start_n // BLOCK_N) * stride_btn)
        k_ptrs = K + physical * stride_kb + offs_n[None, :] * stride_kn + off_hk * stride_kh + offs_d[:, None] * stride_kd
        v_ptrs = V + physical * stride_vb + offs_n[:, None] * stride_vn + off_hk * stride_vh + offs_d[None, :] * stride_vd
        k = tl.load(k_ptrs)
        qk = tl.dot(q, k, input_precision="ieee")
        qk = qk * softmax_scale
        m_ij = tl.maximum(tl.max(qk, 1), m_i)
        p = tl.exp(qk - m_ij[:, None])
        l_ij = tl.sum(p, 1)
        acc_scale = tl.exp(m_i - m_ij)
        acc_o = acc_o * acc_scale[:, None]
        v = tl.load(v_ptrs)
        acc_o += tl.dot(p, v, input_precision="ieee")
        lse_i = lse_i * acc_scale + l_ij
        m_i = m_ij

    out = acc_o / lse_i[:, None]
    out_ptrs = Out + off_b * stride_ob + off_h[:, None] * stride_oh + offs_d[None, :] * stride_od
    tl.store(out_ptrs, out, mask=offs_m[:, None] < ngroups)


def paged_decode(q, k_cache, v_cache, block_table, seq_lens):
    batch, nheads, d = q.shape
    _, page_block_size, nheads_k, _ = k_cache.shape
    ngroups = nheads // nheads_k
    softmax_scale = 1.0 / math.sqrt(d)
    o = torch.empty_like(q)
    BLOCK_M = max(16, triton.next_power_of_2(ngroups))
    grid = (batch, nheads_k)
    _fwd_kernel_paged[grid](
        q, k_cache, v_cache, o, block_table, seq_lens, softmax_scale,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.stride(3),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), v_cache.stride(3),
        o.stride(0), o.stride(1), o.stride(2),
        block_table.stride(0), block_table.stride(1),
        ngroups,
        BLOCK_M=BLOCK_M, BLOCK_N=page_block_size, BLOCK_HEADDIM=d,
    )
    return o
