"""ring-flash-attention's idiom (zhuzilin/ring-flash-attention): a RingComm that queues P2POps and
commits them with batch_isend_irecv, update_out_and_lse with sigmoid and logsigmoid on an lse kept
as (B, H, T, 1), the zig-zag forward's three cases (step 0 causal, step <= rank the first half of
k/v, else the second half of q written back through a slice), and extract_local for the layout."""
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F


def zigzag_shard(x, rank, world_size, dim):
    value_chunks = x.chunk(2 * world_size, dim=dim)
    return torch.cat([value_chunks[rank], value_chunks[2 * world_size - rank - 1]], dim=dim)


def zigzag_unshard(chunks, world_size, dim):
    firsts, seconds = zip(*(c.chunk(2, dim=dim) for c in chunks))
    return torch.cat(list(firsts) + list(seconds)[::-1], dim=dim)


class RingComm:
    def __init__(self, rank, world_size):
        self._ops = []
        self.rank = rank
        self.world_size = world_size
        self._reqs = None
        self.send_rank = (self.rank + 1) % self.world_size
        self.recv_rank = (self.rank - 1) % self.world_size

    def send_recv(self, to_send, recv_tensor=None):
        res = torch.empty_like(to_send) if recv_tensor is None else recv_tensor
        self._ops.append(dist.P2POp(dist.isend, to_send, self.send_rank))
        self._ops.append(dist.P2POp(dist.irecv, res, self.recv_rank))
        return res

    def commit(self):
        if self._reqs is not None:
            raise RuntimeError("commit called twice")
        self._reqs = dist.batch_isend_irecv(self._ops)

    def wait(self):
        if self._reqs is None:
            raise RuntimeError("wait called before commit")
        for req in self._reqs:
            req.wait()
        self._reqs = None
        self._ops = []


def _update_out_and_lse(out, lse, block_out, block_lse):
    block_lse = block_lse.unsqueeze(dim=-1)
    # new_lse = lse + torch.log(1 + torch.exp(block_lse - lse)), written so it never overflows
    out = out - F.sigmoid(block_lse - lse) * (out - block_out)
    lse = lse - F.logsigmoid(lse - block_lse)
    return out, lse


def update_out_and_lse(out, lse, block_out, block_lse, slice_=None):
    if out is None:
        if slice_ is not None:
            raise RuntimeError("first update_out_and_lse should not pass slice_ args")
        return block_out, block_lse.unsqueeze(dim=-1)
    if slice_ is not None:
        slice_out, slice_lse = out[slice_], lse[slice_]
        slice_out, slice_lse = _update_out_and_lse(slice_out, slice_lse, block_out, block_lse)
        out[slice_], lse[slice_] = slice_out, slice_lse
        return out, lse
    return _update_out_and_lse(out, lse, block_out, block_lse)


def _attn_forward(q, k, v, softmax_scale, causal):
    s = torch.matmul(q, k.transpose(-2, -1)) * softmax_scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v), lse


def ring_attention(q, k, v, causal, rank, world_size, zigzag=False):
    dtype = q.dtype
    q, k, v = q.float() if dtype != torch.float64 else q, k.contiguous(), v.contiguous()
    softmax_scale = q.shape[-1] ** (-0.5)
    comm = RingComm(rank, world_size)
    block_seq_len = q.shape[-2] // 2
    q1 = q[:, :, block_seq_len:]
    out, lse = None, None
    for step in range(comm.world_size):
        if step + 1 != comm.world_size:
            next_k = comm.send_recv(k)
            next_v = comm.send_recv(v)
            comm.commit()
        kf, vf = k.to(q.dtype), v.to(q.dtype)
        if not causal:
            out, lse = update_out_and_lse(out, lse, *_attn_forward(q, kf, vf, softmax_scale, False))
        elif step == 0:
            out, lse = update_out_and_lse(out, lse, *_attn_forward(q, kf, vf, softmax_scale, True))
        elif not zigzag:
            if step <= comm.rank:
                out, lse = update_out_and_lse(out, lse, *_attn_forward(q, kf, vf, softmax_scale, False))
        elif step <= comm.rank:
            k0, v0 = kf[:, :, :block_seq_len], vf[:, :, :block_seq_len]
            out, lse = update_out_and_lse(out, lse, *_attn_forward(q, k0, v0, softmax_scale, False))
        else:
            block_out, block_lse = _attn_forward(q1, kf, vf, softmax_scale, False)
            out, lse = update_out_and_lse(out, lse, block_out, block_lse,
                                          slice_=(slice(None), slice(None), slice(block_seq_len, None)))
        if step + 1 != comm.world_size:
            comm.wait()
            k, v = next_k, next_v
    return out.to(dtype), lse.squeeze(dim=-1).float()
