"""An einsum idiom: scores and outputs as einsum("bhqd,bhkd->bhqk") and einsum("bhqk,bhkd->bhqd"),
isend/irecv by hand for the next chunk, the causal mask from global positions with whole blocks
of masked keys skipped, and the merge written with logaddexp."""
import math

import torch
import torch.distributed as dist


def zigzag_shard(x, rank, world_size, dim):
    parts = torch.tensor_split(x, 2 * world_size, dim=dim)
    return torch.cat([parts[rank], parts[-1 - rank]], dim=dim)


def zigzag_unshard(chunks, world_size, dim):
    halves = [torch.tensor_split(c, 2, dim=dim) for c in chunks]
    return torch.cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim=dim)


def global_positions(rank, world_size, n, zigzag):
    i = torch.arange(n)
    if not zigzag:
        return rank * n + i
    h = n // 2
    return torch.where(i < h, rank * h + i, (2 * world_size - 1 - rank) * h + (i - h))


def ring_attention(q, k, v, causal, rank, world_size, zigzag=False):
    orig = q.dtype
    q = q.to(torch.promote_types(orig, torch.float32))
    n, d = q.shape[-2], q.shape[-1]
    qp = global_positions(rank, world_size, n, zigzag)
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
    k, v = k.contiguous(), v.contiguous()
    for step in range(world_size):
        reqs = []
        if step < world_size - 1:
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            reqs = [dist.isend(k, (rank + 1) % world_size), dist.isend(v, (rank + 1) % world_size),
                    dist.irecv(k_next, (rank - 1) % world_size), dist.irecv(v_next, (rank - 1) % world_size)]
        kp = global_positions((rank - step) % world_size, world_size, n, zigzag)
        allowed = (kp[None, :] <= qp[:, None]) if causal else torch.ones(n, n, dtype=torch.bool)
        qi = allowed.any(1).nonzero().flatten()
        ki = allowed.any(0).nonzero().flatten()
        if len(qi):
            s = torch.einsum("bhqd,bhkd->bhqk", q[:, :, qi], k[:, :, ki].to(q.dtype)) / math.sqrt(d)
            s = s.masked_fill(~allowed[qi][:, ki], float("-inf"))
            blse = torch.logsumexp(s, -1)
            bout = torch.einsum("bhqk,bhkd->bhqd", torch.exp(s - blse[..., None]), v[:, :, ki].to(q.dtype))
            new = torch.logaddexp(lse[:, :, qi], blse)
            out[:, :, qi] = torch.exp(lse[:, :, qi] - new)[..., None] * out[:, :, qi] + \
                torch.exp(blse - new)[..., None] * bout
            lse[:, :, qi] = new
        for r in reqs:
            r.wait()
        if reqs:
            k, v = k_next, v_next
    return out.to(orig), lse.float()
