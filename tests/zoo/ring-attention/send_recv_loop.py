"""A plain loop with blocking dist.send and dist.recv, ordered by even and odd rank so that two
neighbours never both wait to receive; the causal mask from global positions, a block skipped
when it masks everything, the running max and sum kept like an online softmax."""
import math

import torch
import torch.distributed as dist


def zigzag_shard(x, rank, world_size, dim):
    n = x.shape[dim] // (2 * world_size)
    first = x.narrow(dim, rank * n, n)
    second = x.narrow(dim, (2 * world_size - 1 - rank) * n, n)
    return torch.cat((first, second), dim)


def zigzag_unshard(chunks, world_size, dim):
    n = chunks[0].shape[dim] // 2
    pieces = [None] * (2 * world_size)
    for rank in range(world_size):
        pieces[rank] = chunks[rank].narrow(dim, 0, n)
        pieces[2 * world_size - 1 - rank] = chunks[rank].narrow(dim, n, n)
    return torch.cat(pieces, dim)


def positions(rank, world_size, length, zigzag):
    if not zigzag:
        return torch.arange(rank * length, (rank + 1) * length)
    half = length // 2
    return torch.cat((torch.arange(rank * half, (rank + 1) * half),
                      torch.arange((2 * world_size - 1 - rank) * half, (2 * world_size - rank) * half)))


def pass_on(k, v, rank, world_size):
    """Send (k, v) to the next rank and return the previous rank's."""
    new_k, new_v = torch.empty_like(k), torch.empty_like(v)
    nxt, prev = (rank + 1) % world_size, (rank - 1) % world_size
    if rank % 2 == 0:
        dist.send(k, nxt)
        dist.send(v, nxt)
        dist.recv(new_k, prev)
        dist.recv(new_v, prev)
    else:
        dist.recv(new_k, prev)
        dist.recv(new_v, prev)
        dist.send(k, nxt)
        dist.send(v, nxt)
    return new_k, new_v


def ring_attention(q, k, v, causal, rank, world_size, zigzag=False):
    dtype, work = q.dtype, (torch.float64 if q.dtype == torch.float64 else torch.float32)
    B, H, T, D = q.shape
    q = q.to(work)
    k, v = k.contiguous(), v.contiguous()
    q_pos = positions(rank, world_size, T, zigzag)
    m = torch.full((B, H, T), float("-inf"), dtype=work)   # running max of the scores
    l = torch.zeros(B, H, T, dtype=work)                    # running sum of exp(score - m)
    acc = torch.zeros(B, H, T, D, dtype=work)               # running sum of exp(score - m) * v
    for step in range(world_size):
        src = (rank - step) % world_size
        k_pos = positions(src, world_size, T, zigzag)
        visible = k_pos[None, :] <= q_pos[:, None]
        rows = visible.any(dim=1) if causal else torch.ones(T, dtype=torch.bool)
        cols = visible.any(dim=0) if causal else torch.ones(T, dtype=torch.bool)
        if rows.any():
            qi, ki, vi = q[:, :, rows], k[:, :, cols].to(work), v[:, :, cols].to(work)
            s = qi @ ki.transpose(-2, -1) / math.sqrt(D)
            if causal:
                s = s.masked_fill(~visible[rows][:, cols], float("-inf"))
            m_new = torch.maximum(m[:, :, rows], s.amax(dim=-1))
            p = torch.exp(s - m_new[..., None])
            alpha = torch.exp(m[:, :, rows] - m_new)
            l[:, :, rows] = alpha * l[:, :, rows] + p.sum(dim=-1)
            acc[:, :, rows] = alpha[..., None] * acc[:, :, rows] + p @ vi
            m[:, :, rows] = m_new
        if step < world_size - 1:
            k, v = pass_on(k, v, rank, world_size)
    return (acc / l[..., None]).to(dtype), (m + torch.log(l)).float()
