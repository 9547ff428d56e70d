"""vLLM's Triton decode kernel in its non-grouped form (`_fwd_kernel_stage1`): a program per
query head, grid (batch, head_num), its KV head `cur_head // kv_group_num`, the query a (D,)
vector. The values are right, but the G query heads of a group each load the same keys and
values: G times the bytes of the grouped kernel, which vLLM uses whenever kv_group_num > 1."""
import torch
import triton
import triton.language as tl


@triton.jit
def _fwd_kernel_stage1(
    Q, K_Buffer, V_Buffer, sm_scale, Req_to_tokens, B_Seqlen, Att_Out,
    stride_req_to_tokens_b, stride_req_to_tokens_n,
    stride_qbs, stride_qh, stride_qd,
    stride_buf_kb, stride_buf_ks, stride_buf_kh, stride_buf_kd,
    stride_buf_vb, stride_buf_vs, stride_buf_vh, stride_buf_vd,
    stride_obs, stride_oh, stride_od,
    kv_group_num: tl.constexpr,
    BLOCK_DMODEL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
):
    cur_batch = tl.program_id(0)
    cur_head = tl.program_id(1)
    cur_kv_head = cur_head // kv_group_num

    offs_d = tl.arange(0, BLOCK_DMODEL)
    cur_batch_seq_len = tl.load(B_Seqlen + cur_batch)
    q = tl.load(Q + cur_batch * stride_qbs + cur_head * stride_qh + offs_d * stride_qd)

    e_max = -float("inf")
    e_sum = 0.0
    acc = tl.zeros([BLOCK_DMODEL], dtype=tl.float32)
    for start_n in range(0, cur_batch_seq_len, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_page_number = tl.load(
            Req_to_tokens + stride_req_to_tokens_b * cur_batch + stride_req_to_tokens_n * (offs_n // PAGE_SIZE),
            mask=offs_n < cur_batch_seq_len, other=0)
        kv_slot = offs_n % PAGE_SIZE
        offs_buf_k = (kv_page_number[:, None] * stride_buf_kb + kv_slot[:, None] * stride_buf_ks
                      + cur_kv_head * stride_buf_kh + offs_d[None, :] * stride_buf_kd)
        k = tl.load(K_Buffer + offs_buf_k, mask=offs_n[:, None] < cur_batch_seq_len, other=0.0)
        qk = tl.sum(q[None, :] * k, 1)
        qk *= sm_scale
        qk = tl.where(offs_n < cur_batch_seq_len, qk, float("-inf"))

        offs_buf_v = (kv_page_number[:, None] * stride_buf_vb + kv_slot[:, None] * stride_buf_vs
                      + cur_kv_head * stride_buf_vh + offs_d[None, :] * stride_buf_vd)
        v = tl.load(V_Buffer + offs_buf_v, mask=offs_n[:, None] < cur_batch_seq_len, other=0.0)

        n_e_max = tl.maximum(tl.max(qk, 0), e_max)
        re_scale = tl.exp(e_max - n_e_max)
        p = tl.exp(qk - n_e_max)
        acc *= re_scale
        acc += tl.sum(p[:, None] * v, 0)
        e_sum = e_sum * re_scale + tl.sum(p, 0)
        e_max = n_e_max

    tl.store(Att_Out + cur_batch * stride_obs + cur_head * stride_oh + offs_d * stride_od, acc / e_sum)


def paged_decode(q, k_cache, v_cache, block_table, seq_lens):
    batch, head_num, Lk = q.shape
    page_size, kv_head_num = k_cache.shape[1], k_cache.shape[2]
    kv_group_num = head_num // kv_head_num
    sm_scale = 1.0 / (Lk ** 0.5)
    o = torch.empty_like(q)
    grid = (batch, head_num)
    _fwd_kernel_stage1[grid](
        q, k_cache, v_cache, sm_scale, block_table, seq_lens, o,
        block_table.stride(0), block_table.stride(1),
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.stride(3),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), v_cache.stride(3),
        o.stride(0), o.stride(1), o.stride(2),
        kv_group_num=kv_group_num,
        BLOCK_DMODEL=Lk,
        BLOCK_N=8,
        PAGE_SIZE=page_size,
    )
    return o
