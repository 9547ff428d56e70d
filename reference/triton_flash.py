"""FlashAttention-2's forward pass as a Triton kernel: one program per block of queries and (batch, head),
an online softmax over the key blocks, and the key blocks above the causal diagonal skipped. After
Triton's fused-attention tutorial (python/tutorials/06-fused-attention.py) and FlashAttention's
Triton kernel (Dao, 2023), written with tl.exp and one stage so that every line shows."""
import math

import torch
import triton
import triton.language as tl


@triton.jit
def _flash_fwd_kernel(Q, K, V, Out, Lse, stride_b, stride_h, stride_t, H, T, sm_scale,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """One program: the BLOCK_M queries of block tl.program_id(0) of (batch, head) tl.program_id(1)
    against the key blocks they see; writes their rows of Out and Lse."""
    start_m = tl.program_id(0)   # which block of queries
    off_bh = tl.program_id(1)   # which (batch, head)
    base = (off_bh // H) * stride_b + (off_bh % H) * stride_h   # q, k, v and out share one layout
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)   # (BLOCK_M,) positions of this block's queries
    offs_n = tl.arange(0, BLOCK_N)   # (BLOCK_N,)
    offs_d = tl.arange(0, HEAD_DIM)   # (HEAD_DIM,)
    # The last query block runs past T: its extra rows load zeros and are never stored.
    q = tl.load(Q + base + offs_m[:, None] * stride_t + offs_d[None, :], mask=offs_m[:, None] < T, other=0.0)   # (BLOCK_M, HEAD_DIM)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)   # (BLOCK_M,) running max of each query's scores
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)   # (BLOCK_M,) running sum of exp(score - m_i)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)   # (BLOCK_M, HEAD_DIM) sum of exp(score - m_i) v, in float32
    # Causal: no query of this block sits after its last row, so key blocks starting there would
    # only add exp(-inf) = 0: they are never loaded.
    hi = tl.minimum((start_m + 1) * BLOCK_M, T) if CAUSAL else T
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n   # (BLOCK_N,) positions of this block's keys
        k = tl.load(K + base + cols[None, :] * stride_t + offs_d[:, None], mask=cols[None, :] < T, other=0.0)   # (HEAD_DIM, BLOCK_N)
        s = tl.dot(q, k) * sm_scale   # (BLOCK_M, BLOCK_N) float32 scores
        allowed = cols[None, :] < T   # (1, BLOCK_N) the last key block runs past T
        if CAUSAL:
            allowed = allowed & (cols[None, :] <= offs_m[:, None])   # (BLOCK_M, BLOCK_N) query i sees keys <= i
        s = tl.where(allowed, s, float("-inf"))   # (BLOCK_M, BLOCK_N)
        m_new = tl.maximum(m_i, tl.max(s, 1))   # (BLOCK_M,) finite: key 0 is in the first block every row visits
        p = tl.exp(s - m_new[:, None])   # (BLOCK_M, BLOCK_N) each <= 1: no overflow
        # What l_i and acc hold was summed as exp(score - m_i): re-expressed under the new max.
        alpha = tl.exp(m_i - m_new)   # (BLOCK_M,) 0 on the first block (m_i = -inf)
        l_i = l_i * alpha + tl.sum(p, 1)   # (BLOCK_M,)
        v = tl.load(V + base + cols[:, None] * stride_t + offs_d[None, :], mask=cols[:, None] < T, other=0.0)   # (BLOCK_N, HEAD_DIM)
        # p in v's dtype, as tensor cores take it; the product is accumulated in float32 all the same.
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)   # (BLOCK_M, HEAD_DIM)
        m_i = m_new
    out = acc / l_i[:, None]   # (BLOCK_M, HEAD_DIM) normalised once, after the last key block
    tl.store(Out + base + offs_m[:, None] * stride_t + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=offs_m[:, None] < T)
    # log sum exp(s) = m + log sum exp(s - m), in natural log: what a backward pass needs.
    tl.store(Lse + off_bh * T + offs_m, m_i + tl.log(l_i), mask=offs_m < T)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, BLOCK_M: int = 16,
                    BLOCK_N: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ / sqrt(D)) v by a Triton kernel, one (BLOCK_M, BLOCK_N) block of scores at a time.

    q, k, v ``(B, H, T, D)`` contiguous, float32 or float16, D a power of two. Returns ``(out, lse)``:
    out ``(B, H, T, D)`` in q's dtype, and lse ``(B, H, T)`` float32, the natural log of the sum of
    exp(score) over the keys each query attends to. ``causal``: query i attends to keys 0 .. i, and
    the key blocks above the diagonal are skipped. One program per (query block, batch·head): grid
    ``(cdiv(T, BLOCK_M), B * H)``; BLOCK_M and BLOCK_N powers of two, BLOCK_M a multiple of BLOCK_N.
    """
    B, H, T, D = q.shape
    out = torch.empty_like(q)   # (B, H, T, D) in q's dtype
    lse = torch.empty((B, H, T), dtype=torch.float32, device=q.device)   # (B, H, T)
    grid = (triton.cdiv(T, BLOCK_M), B * H)
    _flash_fwd_kernel[grid](q, k, v, out, lse, q.stride(0), q.stride(1), q.stride(2), H, T, 1.0 / math.sqrt(D),
                            HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=causal)
    return out, lse
