"""The plain one-stage kernel with the accumulator never rescaled: l is multiplied by exp(m - m_new)
when the max moves, o keeps what it summed under the old max."""
import math

import torch
import triton
import triton.language as tl


@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
                     sb, sh, st, n_heads, seq_len, scale,
                     D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr):
    pid_m = tl.program_id(axis=0)
    pid_bh = tl.program_id(axis=1)
    head = (pid_bh // n_heads) * sb + (pid_bh % n_heads) * sh
    rows = pid_m * BM + tl.arange(0, BM)
    dims = tl.arange(0, D)
    row_ok = rows < seq_len

    q = tl.load(q_ptr + head + rows[:, None] * st + dims[None, :], mask=row_ok[:, None], other=0.0)
    q = (q * scale).to(q_ptr.dtype.element_ty)   # scaled once, here

    m = tl.full((BM,), -float("inf"), tl.float32)
    l = tl.zeros((BM,), tl.float32)
    o = tl.zeros((BM, D), tl.float32)

    end = seq_len
    if CAUSAL:
        end = tl.minimum(seq_len, (pid_m + 1) * BM)
    for n0 in range(0, end, BN):
        cols = n0 + tl.arange(0, BN)
        col_ok = cols < seq_len
        kb = tl.load(k_ptr + head + cols[:, None] * st + dims[None, :], mask=col_ok[:, None], other=0.0)
        vb = tl.load(v_ptr + head + cols[:, None] * st + dims[None, :], mask=col_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(kb))
        keep = col_ok[None, :]
        if CAUSAL:
            keep = keep & (rows[:, None] >= cols[None, :])
        s = tl.where(keep, s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        corr = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * corr + tl.sum(p, axis=1)
        o = o + tl.dot(p.to(vb.dtype), vb)
        m = m_new

    tl.store(o_ptr + head + rows[:, None] * st + dims[None, :], (o / l[:, None]).to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None])
    tl.store(lse_ptr + pid_bh * seq_len + rows, m + tl.log(l), mask=row_ok)


def flash_attention(q, k, v, causal=False, BLOCK_M=16, BLOCK_N=16):
    B, H, T, D = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
    attention_kernel[(triton.cdiv(T, BLOCK_M), B * H)](
        q, k, v, o, lse, *q.stride()[:3], H, T, 1 / math.sqrt(D),
        D=D, BM=BLOCK_M, BN=BLOCK_N, CAUSAL=causal)
    return o, lse
