"""The structure of Triton's fused-attention tutorial (06-fused-attention.py) in PyTorch, exp2
and the off-band/on-band stages, with the output normalised as it goes: each tile's p @ v is
divided by l_i, the sum so far, and added to acc, which is neither rescaled by alpha nor divided
at the end (`acc = acc + p @ v / l_i`: normalise-per-block)."""
import math

import torch

LOG2E = math.log2(math.e)   # the tutorial's 1.44269504 is float32's; float64 inputs need all the digits


def _inner(acc, l_i, m_i, q, k, v, start_m, block_m, lo, hi, block_n, stage, qk_scale, offset):
    for start_n in range(lo, hi, block_n):
        end_n = min(start_n + block_n, hi)
        qk = torch.matmul(q, k[:, :, start_n:end_n].transpose(2, 3))
        if stage == 2:   # on-band: mask the keys after each query's position
            offs_m = torch.arange(start_m, start_m + q.shape[2], device=q.device) + offset
            offs_n = torch.arange(start_n, end_n, device=q.device)
            mask = offs_m[:, None] >= offs_n[None, :]
            qk = qk * qk_scale + torch.where(mask, 0.0, -1.0e6)
            m_ij = torch.maximum(m_i, qk.amax(-1))
            qk = qk - m_ij[..., None]
        else:
            m_ij = torch.maximum(m_i, qk.amax(-1) * qk_scale)
            qk = qk * qk_scale - m_ij[..., None]
        p = torch.exp2(qk)
        l_ij = p.sum(-1)
        alpha = torch.exp2(m_i - m_ij)
        l_i = l_i * alpha + l_ij
        acc = acc + torch.matmul(p, v[:, :, start_n:end_n]) / l_i[..., None]
        m_i = m_ij
    return acc, l_i, m_i


def flash_attention(q, k, v, block_q=64, block_k=64, causal=False):
    BLOCK_M, BLOCK_N = block_q, block_k
    assert BLOCK_M >= 1 and BLOCK_N >= 1, "BLOCK_M and BLOCK_N must be positive"
    Z, H, N_CTX_Q, HEAD_DIM = q.shape
    N_CTX_K = k.shape[2]
    assert not (causal and N_CTX_Q > N_CTX_K), "causal attention needs N_CTX_Q <= N_CTX_K"
    sm_scale = 1.0 / math.sqrt(HEAD_DIM)
    qk_scale = sm_scale * LOG2E
    offset = N_CTX_K - N_CTX_Q
    o = torch.empty_like(q)
    M = torch.empty(Z, H, N_CTX_Q, dtype=q.dtype, device=q.device)
    for start_m in range(0, N_CTX_Q, BLOCK_M):
        q_blk = q[:, :, start_m:start_m + BLOCK_M]
        rows = q_blk.shape[2]
        m_i = torch.full((Z, H, rows), float("-inf"), dtype=q.dtype, device=q.device)
        l_i = torch.zeros(Z, H, rows, dtype=q.dtype, device=q.device)
        acc = torch.zeros(Z, H, rows, HEAD_DIM, dtype=q.dtype, device=q.device)
        if causal:
            first, last = start_m + offset, start_m + rows - 1 + offset   # positions of the block's queries
            band = (first + 1) // BLOCK_N * BLOCK_N   # key blocks before it are seen by every query
            acc, l_i, m_i = _inner(acc, l_i, m_i, q_blk, k, v, start_m, BLOCK_M, 0, band, BLOCK_N, 1, qk_scale, offset)
            acc, l_i, m_i = _inner(acc, l_i, m_i, q_blk, k, v, start_m, BLOCK_M, band, last + 1, BLOCK_N, 2, qk_scale,
                                   offset)
        else:
            acc, l_i, m_i = _inner(acc, l_i, m_i, q_blk, k, v, start_m, BLOCK_M, 0, N_CTX_K, BLOCK_N, 1, qk_scale,
                                   offset)
        m_i = m_i + torch.log2(l_i)
        o[:, :, start_m:start_m + rows] = acc
        M[:, :, start_m:start_m + rows] = m_i / LOG2E   # the tutorial stores base 2; lse is natural
    return o, M
