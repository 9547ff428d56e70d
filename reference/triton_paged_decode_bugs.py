"""Known triton-paged-decode bugs, each the reference with exactly that mistake.

One kernel serves them all: the constexpr MISTAKE names the one line that differs from the
reference's kernel (an empty string is the reference's), so each bug is the reference but that
line. The launchers' mistakes (strides, scale, copies, torch) are in the launchers.
"""
import math

import torch
import triton
import triton.language as tl


@triton.jit
def _kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr,
    stride_qb, stride_qh, stride_qd,
    stride_kn, stride_ks, stride_kh, stride_kd,
    stride_vn, stride_vs, stride_vh, stride_vd,
    stride_tb, stride_tn,
    stride_ob, stride_oh, stride_od,
    scale,
    G: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
    MISTAKE: tl.constexpr,
):
    seq = tl.program_id(0)
    offs_g = tl.arange(0, BLOCK_G)
    offs_s = tl.arange(0, BLOCK_SIZE)
    offs_d = tl.arange(0, HEAD_DIM)
    if MISTAKE == "per-query-head":
        heads = tl.program_id(1) + offs_g   # BLOCK_G is 1: one query head per program
        kv_head = tl.program_id(1) // G   # ... so its KV head is read again by the next G - 1 programs
        in_group = offs_g < 1
    elif MISTAKE == "tiled":
        kv_head = tl.program_id(1)
        heads = kv_head + offs_g * (tl.num_programs(1))   # heads kv_head, kv_head + Hkv, ...: j % Hkv, not j // G
        in_group = offs_g < G
    else:
        kv_head = tl.program_id(1)
        heads = kv_head * G + offs_g
        in_group = offs_g < G

    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=in_group[:, None], other=0.0).to(tl.float32)
    q = q * scale
    seq_len = tl.load(lens_ptr + seq)

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    for j in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
        if MISTAKE == "gathered":   # the launcher's copy holds sequence seq's blocks at seq * max_blocks + j
            block = seq * stride_tb + j
        elif MISTAKE == "logical-block":
            block = j + seq * 0   # the logical block index used as the physical one: the table never read
        else:
            block = tl.load(table_ptr + seq * stride_tb + j * stride_tn)
        valid = j * BLOCK_SIZE + offs_s < seq_len
        if MISTAKE == "unmasked":   # the whole last block read and attended, its empty slots too
            valid = offs_s < BLOCK_SIZE
        k = tl.load(k_ptr + block * stride_kn + offs_s[:, None] * stride_ks + kv_head * stride_kh
                    + offs_d[None, :] * stride_kd, mask=valid[:, None], other=0.0)
        v = tl.load(v_ptr + block * stride_vn + offs_s[:, None] * stride_vs + kv_head * stride_vh
                    + offs_d[None, :] * stride_vd, mask=valid[:, None], other=0.0)

        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)
        if MISTAKE == "double-scale":
            s = s * scale   # q was scaled already
        if MISTAKE != "scores-unmasked":   # loads masked, but the empty slots score 0 and get weight
            s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new

    out = acc / l[:, None]
    tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + offs_d[None, :] * stride_od,
             out.to(out_ptr.dtype.element_ty), mask=in_group[:, None])


def _launch(q, k_cache, v_cache, block_table, seq_lens, mistake="", scale=None, k_strides=None, v_strides=None,
            grid_heads=None, block_g=None):
    """The reference's launch of ``_kernel`` with one mistake."""
    B, Hq, D = q.shape
    num_blocks, block_size, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    out = torch.empty_like(q)
    _kernel[(B, grid_heads or Hkv)](
        q, k_cache, v_cache, block_table, seq_lens, out,
        q.stride(0), q.stride(1), q.stride(2),
        *(k_strides or k_cache.stride()), *(v_strides or v_cache.stride()),
        block_table.stride(0), block_table.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        1.0 / math.sqrt(D) if scale is None else scale,
        G=G, BLOCK_G=block_g or triton.next_power_of_2(G), BLOCK_SIZE=block_size, HEAD_DIM=D, MISTAKE=mistake,
    )
    return out


def logical_block_as_physical(q, k_cache, v_cache, block_table, seq_lens):
    return _launch(q, k_cache, v_cache, block_table, seq_lens, mistake="logical-block")


def strides_from_shape(q, k_cache, v_cache, block_table, seq_lens):
    # the cache taken as contiguous: right for a fresh pool, wrong for k and v viewed out of one tensor
    num_blocks, block_size, Hkv, D = k_cache.shape
    contiguous = (block_size * Hkv * D, Hkv * D, D, 1)
    return _launch(q, k_cache, v_cache, block_table, seq_lens, k_strides=contiguous, v_strides=contiguous)


def last_block_unmasked(q, k_cache, v_cache, block_table, seq_lens):
    return _launch(q, k_cache, v_cache, block_table, seq_lens, mistake="unmasked")


def tail_scores_unmasked(q, k_cache, v_cache, block_table, seq_lens):
    return _launch(q, k_cache, v_cache, block_table, seq_lens, mistake="scores-unmasked")


def program_per_query_head(q, k_cache, v_cache, block_table, seq_lens):
    # grid (B, Hq): right values, but each KV head's keys and values are read G times
    return _launch(q, k_cache, v_cache, block_table, seq_lens, mistake="per-query-head", grid_heads=q.shape[1],
                   block_g=1)


def kv_heads_tiled(q, k_cache, v_cache, block_table, seq_lens):
    return _launch(q, k_cache, v_cache, block_table, seq_lens, mistake="tiled")


def unscaled(q, k_cache, v_cache, block_table, seq_lens):
    return _launch(q, k_cache, v_cache, block_table, seq_lens, scale=1.0)


def scaled_twice(q, k_cache, v_cache, block_table, seq_lens):
    return _launch(q, k_cache, v_cache, block_table, seq_lens, mistake="double-scale")


def gathered_copy(q, k_cache, v_cache, block_table, seq_lens):
    # each sequence's blocks copied out of the pool in table order, then a table that reads the copy
    k = k_cache[block_table].flatten(0, 1)   # (B * max_blocks, block_size, Hkv, D), a copy
    v = v_cache[block_table].flatten(0, 1)
    return _launch(q, k, v, block_table, seq_lens, mistake="gathered")


@triton.jit
def _copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def torch_attention_copy_kernel(q, k_cache, v_cache, block_table, seq_lens):
    # the attention computed in the launcher with torch; the kernel only copies the answer out
    B, Hq, D = q.shape
    block_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    answer = torch.empty_like(q)
    for b in range(B):
        pos = torch.arange(int(seq_lens[b]))
        blocks = block_table[b].long()[pos // block_size]
        k = k_cache[blocks, pos % block_size].repeat_interleave(Hq // Hkv, dim=1)   # (L, Hq, D)
        v = v_cache[blocks, pos % block_size].repeat_interleave(Hq // Hkv, dim=1)
        p = torch.softmax(torch.einsum("hd,lhd->hl", q[b], k) / math.sqrt(D), dim=-1)   # (Hq, L)
        answer[b] = torch.einsum("hl,lhd->hd", p, v)
    out = torch.empty_like(q)
    _copy_kernel[(triton.cdiv(q.numel(), 64),)](answer, out, q.numel(), BLOCK=64)
    return out


BUGS = {
    "block-offset-wrong": [{"paged_decode": logical_block_as_physical}, {"paged_decode": strides_from_shape}],
    "last-block-unmasked": [{"paged_decode": last_block_unmasked}, {"paged_decode": tail_scores_unmasked}],
    "kv-head-per-query-head": {"paged_decode": program_per_query_head},
    "gathers-in-launcher": {"paged_decode": gathered_copy},
    "launcher-computes": {"paged_decode": torch_attention_copy_kernel},
    "kv-repeat-tiled": {"paged_decode": kv_heads_tiled},
    "no-scaling": {"paged_decode": unscaled},
    "double-scale": {"paged_decode": scaled_twice},
}
