"""Megatron-LM / TransformerEngine context parallelism's idiom, with the output correction written as a
mean of the steps' outputs: the lse is corrected, the outputs are not weighed by it."""
import torch
import torch.distributed as dist


def get_seq_chunk_ids_for_reordering(cp_size, cp_rank):
    return [cp_rank, 2 * cp_size - cp_rank - 1]


def zigzag_shard(x, rank, world_size, dim):
    x = x.view(*x.shape[:dim % x.dim()], 2 * world_size, -1, *x.shape[dim % x.dim() + 1:])
    index = torch.tensor(get_seq_chunk_ids_for_reordering(world_size, rank))
    x = x.index_select(dim % (x.dim() - 1), index)
    return x.flatten(dim % (x.dim() - 1), dim % (x.dim() - 1) + 1)


def zigzag_unshard(chunks, world_size, dim):
    order = [i for rank in range(world_size) for i in get_seq_chunk_ids_for_reordering(world_size, rank)]
    pieces = [piece for shard in chunks for piece in shard.chunk(2, dim=dim)]
    return torch.cat([pieces[order.index(i)] for i in range(2 * world_size)], dim=dim)


def flash_attn_fwd_softmax_lse_correction(softmax_lse, softmax_lse_per_step):
    max_scale = torch.max(softmax_lse, softmax_lse_per_step)
    min_scale = torch.min(softmax_lse, softmax_lse_per_step)
    return max_scale + torch.log1p(torch.exp(min_scale - max_scale))


def flash_attn_fwd_out_correction(out, out_per_step, softmax_lse, softmax_lse_per_step, new_lse):
    return (out + out_per_step) / 2   # each step's output counted alike, whatever its share of the softmax


def attn_fwd(q, k, v, causal):
    scores = torch.matmul(q, k.transpose(-1, -2)) / (q.size(-1) ** 0.5)
    if causal:
        mask = torch.tril(torch.ones(q.size(-2), k.size(-2), dtype=torch.bool))
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.softmax(scores, dim=-1), v), lse


def ring_attention(q, k, v, causal, rank, world_size, zigzag=False):
    cp_size, cp_rank = world_size, rank
    send_dst, recv_src = (cp_rank + 1) % cp_size, (cp_rank - 1) % cp_size
    in_dtype = q.dtype
    q = q.to(torch.promote_types(q.dtype, torch.float32))
    p2p_comm_buffers = [torch.stack([k, v]), None]   # [2, B, H, T, D]: K and V travel as one tensor
    out, softmax_lse = None, None
    half = q.size(-2) // 2
    for i in range(cp_size):
        send_recv_reqs = []
        if i < cp_size - 1:
            p2p_comm_buffers[(i + 1) % 2] = torch.empty_like(p2p_comm_buffers[i % 2])
            send_recv_reqs.append(dist.isend(p2p_comm_buffers[i % 2], send_dst))
            send_recv_reqs.append(dist.irecv(p2p_comm_buffers[(i + 1) % 2], recv_src))
        kv_inputs = p2p_comm_buffers[i % 2].to(q.dtype)
        out_per_step, softmax_lse_per_step, rows = None, None, slice(None)
        if not causal:
            out_per_step, softmax_lse_per_step = attn_fwd(q, kv_inputs[0], kv_inputs[1], False)
        elif i == 0:
            out_per_step, softmax_lse_per_step = attn_fwd(q, kv_inputs[0], kv_inputs[1], True)
        elif i <= cp_rank:
            if zigzag:   # the earlier rank's first chunk only: its second comes after all of ours
                kv_inputs = kv_inputs[:, :, :, :half]
            out_per_step, softmax_lse_per_step = attn_fwd(q, kv_inputs[0], kv_inputs[1], False)
        elif zigzag:   # a later rank: our second chunk sees both of its chunks
            rows = slice(half, None)
            out_per_step, softmax_lse_per_step = attn_fwd(q[:, :, rows], kv_inputs[0], kv_inputs[1], False)
        if out_per_step is not None:
            if out is None:
                out, softmax_lse = out_per_step, softmax_lse_per_step
            else:
                new_lse = flash_attn_fwd_softmax_lse_correction(softmax_lse[:, :, rows], softmax_lse_per_step)
                out[:, :, rows] = flash_attn_fwd_out_correction(out[:, :, rows], out_per_step,
                                                                softmax_lse[:, :, rows], softmax_lse_per_step, new_lse)
                softmax_lse[:, :, rows] = new_lse
        for req in send_recv_reqs:
            req.wait()
        p2p_comm_buffers[i % 2] = None   # its chunk has left and been used: let it go
    return out.to(in_dtype), softmax_lse.float()
