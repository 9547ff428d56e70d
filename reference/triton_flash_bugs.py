"""Known triton-flash bugs, each the reference with exactly that mistake.

``_buggy_kernel`` is the reference's kernel with a ``MISTAKE`` switch at the line each bug changes;
each public function below is one bug (or one way of writing it), named in BUGS by its diagnosis code.
"""
import math

import torch
import triton
import triton.language as tl



@triton.jit
def _buggy_kernel(Q, K, V, Out, Lse, stride_b, stride_h, stride_t, H, T, sm_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                  MISTAKE: tl.constexpr):
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    base = (off_bh // H) * stride_b + (off_bh % H) * stride_h
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)   # (BLOCK_M,)
    offs_n = tl.arange(0, BLOCK_N)   # (BLOCK_N,)
    offs_d = tl.arange(0, HEAD_DIM)   # (HEAD_DIM,)
    q = tl.load(Q + base + offs_m[:, None] * stride_t + offs_d[None, :], mask=offs_m[:, None] < T, other=0.0)   # (BLOCK_M, HEAD_DIM)
    if MISTAKE == "double-scale":
        q = (q * sm_scale).to(Q.dtype.element_ty)   # q scaled here, and the scores by sm_scale again below
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)   # (BLOCK_M,)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)   # (BLOCK_M,)
    if MISTAKE == "half-acc" or MISTAKE == "half-dot":
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=Q.dtype.element_ty)   # (BLOCK_M, HEAD_DIM) in the inputs' dtype
    else:
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)   # (BLOCK_M, HEAD_DIM)
    hi = tl.minimum((start_m + 1) * BLOCK_M, T) if CAUSAL else T
    if MISTAKE == "all-blocks":
        hi = T   # every key block loaded, the ones above the diagonal masked whole
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n   # (BLOCK_N,)
        k = tl.load(K + base + cols[None, :] * stride_t + offs_d[:, None], mask=cols[None, :] < T, other=0.0)   # (HEAD_DIM, BLOCK_N)
        s = tl.dot(q, k)   # (BLOCK_M, BLOCK_N)
        if MISTAKE != "no-scaling":
            s = s * sm_scale
        allowed = cols[None, :] < T   # (1, BLOCK_N)
        if CAUSAL:
            allowed = allowed & (cols[None, :] <= offs_m[:, None])   # (BLOCK_M, BLOCK_N)
        s = tl.where(allowed, s, float("-inf"))   # (BLOCK_M, BLOCK_N)
        if MISTAKE == "stats-over-queries":
            m_new = tl.maximum(m_i, tl.max(s, 0))   # one max per key, not per query: right only by shape
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))   # (BLOCK_M,)
        if MISTAKE == "exp2" or MISTAKE == "exp2-lse-log2":
            p = tl.exp2(s - m_new[:, None])   # 2^(s - m), natural-log scores: softmax(s · ln 2)
            alpha = tl.exp2(m_i - m_new)   # (BLOCK_M,)
        else:
            p = tl.exp(s - m_new[:, None])   # (BLOCK_M, BLOCK_N)
            alpha = tl.exp(m_i - m_new)   # (BLOCK_M,)
        if MISTAKE == "no-rescale":
            l_i = l_i + tl.sum(p, 1)   # what was summed under the old max stays as it was
        elif MISTAKE == "stats-over-queries":
            l_i = l_i * alpha + tl.sum(p, 0)
        else:
            l_i = l_i * alpha + tl.sum(p, 1)   # (BLOCK_M,)
        v = tl.load(V + base + cols[:, None] * stride_t + offs_d[None, :], mask=cols[:, None] < T, other=0.0)   # (BLOCK_N, HEAD_DIM)
        if MISTAKE == "no-rescale" or MISTAKE == "no-rescale-acc":
            acc = acc + tl.dot(p.to(v.dtype), v)   # the accumulator keeps the old max's scale
        elif MISTAKE == "half-acc":
            acc = (acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)).to(Q.dtype.element_ty)   # rounded to float16 every block
        elif MISTAKE == "half-dot":
            acc = acc * alpha[:, None].to(acc.dtype) + tl.dot(p.to(v.dtype), v, out_dtype=Q.dtype.element_ty)
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)   # (BLOCK_M, HEAD_DIM)
        m_i = m_new
    out = acc / l_i[:, None]   # (BLOCK_M, HEAD_DIM)
    tl.store(Out + base + offs_m[:, None] * stride_t + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=offs_m[:, None] < T)
    if MISTAKE == "lse-log-l":
        lse = tl.log(l_i)   # the log of a sum of exp(s - m): off by m
    elif MISTAKE == "exp2-lse-log2":
        lse = (m_i + tl.log2(l_i)) * 0.6931471805599453   # the tutorial's base-2 lse, of unconverted scores
    else:
        lse = m_i + tl.log(l_i)   # (BLOCK_M,)
    tl.store(Lse + off_bh * T + offs_m, lse, mask=offs_m < T)


def _launch(q, k, v, causal, BLOCK_M, BLOCK_N, mistake):
    B, H, T, D = q.shape
    out = torch.empty_like(q)   # (B, H, T, D)
    lse = torch.empty((B, H, T), dtype=torch.float32, device=q.device)   # (B, H, T)
    grid = (triton.cdiv(T, BLOCK_M), B * H)
    _buggy_kernel[grid](q, k, v, out, lse, q.stride(0), q.stride(1), q.stride(2), H, T, 1.0 / math.sqrt(D),
                        HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=causal, MISTAKE=mistake)
    return out, lse


def missing_rescale(q, k, v, causal=False, BLOCK_M=16, BLOCK_N=16):
    return _launch(q, k, v, causal, BLOCK_M, BLOCK_N, "no-rescale")


def missing_rescale_of_acc(q, k, v, causal=False, BLOCK_M=16, BLOCK_N=16):
    return _launch(q, k, v, causal, BLOCK_M, BLOCK_N, "no-rescale-acc")


def every_key_block(q, k, v, causal=False, BLOCK_M=16, BLOCK_N=16):
    return _launch(q, k, v, causal, BLOCK_M, BLOCK_N, "all-blocks")


def exp2_of_natural_scores(q, k, v, causal=False, BLOCK_M=16, BLOCK_N=16):
    return _launch(q, k, v, causal, BLOCK_M, BLOCK_N, "exp2")


def exp2_with_base2_lse(q, k, v, causal=False, BLOCK_M=16, BLOCK_N=16):
    return _launch(q, k, v, causal, BLOCK_M, BLOCK_N, "exp2-lse-log2")


def lse_without_the_max(q, k, v, causal=False, BLOCK_M=16, BLOCK_N=16):
    return _launch(q, k, v, causal, BLOCK_M, BLOCK_N, "lse-log-l")


def accumulator_in_half(q, k, v, causal=False, BLOCK_M=16, BLOCK_N=16):
    return _launch(q, k, v, causal, BLOCK_M, BLOCK_N, "half-acc")


def products_in_half(q, k, v, causal=False, BLOCK_M=16, BLOCK_N=16):
    return _launch(q, k, v, causal, BLOCK_M, BLOCK_N, "half-dot")


def unscaled(q, k, v, causal=False, BLOCK_M=16, BLOCK_N=16):
    return _launch(q, k, v, causal, BLOCK_M, BLOCK_N, "no-scaling")


def scaled_twice(q, k, v, causal=False, BLOCK_M=16, BLOCK_N=16):
    return _launch(q, k, v, causal, BLOCK_M, BLOCK_N, "double-scale")


def stats_over_the_queries(q, k, v, causal=False, BLOCK_M=16, BLOCK_N=16):
    return _launch(q, k, v, causal, BLOCK_M, BLOCK_N, "stats-over-queries")


@triton.jit
def _copy_kernel(Src, Dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)   # (BLOCK,)
    tl.store(Dst + offs, tl.load(Src + offs, mask=offs < n), mask=offs < n)


def computed_by_torch(q, k, v, causal=False, BLOCK_M=16, BLOCK_N=16):
    """The launcher computes attention with torch and a kernel only copies the answer."""
    T, D = q.shape[-2], q.shape[-1]
    s = q.float() @ k.float().transpose(-2, -1) / math.sqrt(D)   # (B, H, T, T): what the kernel should never build
    if causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    answer = (s.softmax(-1) @ v.float()).to(q.dtype)   # (B, H, T, D)
    out = torch.empty_like(q)
    _copy_kernel[(triton.cdiv(out.numel(), 256),)](answer, out, out.numel(), BLOCK=256)
    return out, s.logsumexp(-1)


BUGS = {
    "rescale-missing": [{"flash_attention": missing_rescale}, {"flash_attention": missing_rescale_of_acc}],
    "causal-blocks-not-skipped": {"flash_attention": every_key_block},
    "exp2-without-log2e": [{"flash_attention": exp2_of_natural_scores}, {"flash_attention": exp2_with_base2_lse}],
    "lse-missing-max": {"flash_attention": lse_without_the_max},
    "accumulate-in-half": [{"flash_attention": accumulator_in_half}, {"flash_attention": products_in_half}],
    "launcher-computes": {"flash_attention": computed_by_torch},
    "no-scaling": {"flash_attention": unscaled},
    "double-scale": {"flash_attention": scaled_twice},
    "softmax-wrong-dim": {"flash_attention": stats_over_the_queries},
}
