"""Known ring-attention bugs, each the reference with exactly that mistake.

An oracle whose mistake sits in a helper is the reference's ring_attention run with that helper
replaced (``_with``), as a learner's file whose ring calls its own buggy helper would behave. The
oracles whose mistake is in the positions of the causal mask are written as a ring that masks
every block by the global positions of its queries and keys (``_masked_ring``), the way many
learners write it: the same answers as the reference, from wrong positions.
"""
import math
import types

import torch
import torch.distributed as dist

from reference import ring_attention as reference


def _with(name, **helpers):
    """The reference's ring_attention with some of the names it calls replaced, named ``name``."""
    fn = reference.ring_attention
    return types.FunctionType(fn.__code__, {**fn.__globals__, **helpers}, name, fn.__defaults__)


# --- lse-not-rescaled: the partials merged without their weights exp(lse_i - lse) ---

def merge_mean(out, lse, block_out, block_lse):
    return (out + block_out) / 2, torch.logaddexp(lse, block_lse)   # every block weighed the same


def merge_sum(out, lse, block_out, block_lse):
    return out + block_out, torch.logaddexp(lse, block_lse)   # each row's weights sum to the number of blocks


# --- the shared mistakes of the block's scores and softmax ---

def _block(scale, dim=-1):
    def block(q, k, v, mask=None):
        scores = (q @ k.transpose(-2, -1)) * scale(q.size(-1))   # (B, H, Tq, Tk)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)   # (B, H, Tq)
        return torch.softmax(scores, dim=dim) @ v, lse
    return block


ring_merged_by_mean = _with("ring_merged_by_mean", _merge=merge_mean)
ring_merged_by_sum = _with("ring_merged_by_sum", _merge=merge_sum)
ring_unscaled = _with("ring_unscaled", _block_attention=_block(lambda d: 1.0))
ring_scaled_twice = _with("ring_scaled_twice", _block_attention=_block(lambda d: 1.0 / d))
ring_softmax_over_queries = _with("ring_softmax_over_queries", _block_attention=_block(lambda d: d ** -0.5, dim=-2))


# --- a ring whose causal mask comes from positions: every block computed, masked ---

def _contiguous(rank, world_size, T):
    return rank * T + torch.arange(T)   # (T,) the global positions of rank's chunk


def _zigzag(rank, world_size, T):
    half, local = T // 2, torch.arange(T)
    return torch.where(local < half, rank * half + local, (2 * world_size - 1 - rank) * half + local - half)


def _masked_ring(name, positions, key_positions=None):
    """A ring that computes every block, masked where a key's position (``key_positions``, else
    ``positions``) is after the query's: ``positions(rank, world_size, T_local, zigzag)``."""
    key_positions = key_positions or positions

    def ring_attention(q, k, v, causal, rank, world_size, zigzag=False):
        dtype, acc = q.dtype, torch.promote_types(q.dtype, torch.float32)
        q, k, v = q.to(acc), k.contiguous(), v.contiguous()
        T = q.size(-2)
        send_to, recv_from = (rank + 1) % world_size, (rank - 1) % world_size
        out = lse = None
        for step in range(world_size):
            if step + 1 < world_size:
                next_k, next_v = torch.empty_like(k), torch.empty_like(v)
                transfers = dist.batch_isend_irecv([dist.P2POp(dist.isend, k, send_to),
                                                    dist.P2POp(dist.isend, v, send_to),
                                                    dist.P2POp(dist.irecv, next_k, recv_from),
                                                    dist.P2POp(dist.irecv, next_v, recv_from)])
            src = (rank - step) % world_size
            mask = None
            if causal:
                keys, queries = key_positions(src, world_size, T, zigzag), positions(rank, world_size, T, zigzag)
                mask = keys[None, :] <= queries[:, None]   # (T, T)
            scores = (q @ k.to(acc).transpose(-2, -1)) / math.sqrt(q.size(-1))   # (B, H, T, T)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            block_lse = torch.logsumexp(scores, dim=-1)   # (B, H, T), -inf for a row that sees no key
            seen = torch.isfinite(block_lse)[..., None]
            weights = torch.where(seen, torch.exp(scores - torch.where(seen, block_lse[..., None], 0.0)), 0.0)
            block_out = weights @ v.to(acc)   # (B, H, T, hd), 0 for a row that sees no key
            out, lse = (block_out, block_lse) if out is None else reference._merge(out, lse, block_out, block_lse)
            if step + 1 < world_size:
                for transfer in transfers:
                    transfer.wait()
                k, v = next_k, next_v
        return out.to(dtype), lse.float()
    ring_attention.__name__ = ring_attention.__qualname__ = name
    return ring_attention


def _global(rank, world_size, T, zigzag):
    return (_zigzag if zigzag else _contiguous)(rank, world_size, T)


def _local(rank, world_size, T, zigzag):
    return torch.arange(T)   # the chunk's own indices, whatever rank holds it


# --- zigzag-order: the zig-zag layout's chunks taken in another order ---

def _layout(name, pair):
    """zigzag_shard, zigzag_unshard and the positions of a layout where rank r keeps chunks pair(r, W)."""
    def shard(x, rank, world_size, dim):
        chunks = x.chunk(2 * world_size, dim=dim)
        return torch.cat([chunks[i] for i in pair(rank, world_size)], dim=dim)

    def unshard(chunks, world_size, dim):
        placed = {}
        for rank, shard_ in enumerate(chunks):
            for i, part in zip(pair(rank, world_size), shard_.chunk(2, dim=dim)):
                placed[i] = part
        return torch.cat([placed[i] for i in range(2 * world_size)], dim=dim)

    def positions(rank, world_size, T, zigzag):   # asked for the zig-zag layout only (see ring below)
        half = T // 2
        first, second = pair(rank, world_size)
        return torch.cat([first * half + torch.arange(half), second * half + torch.arange(half)])

    masked = _masked_ring(f"ring_{name}", positions)

    def ring(q, k, v, causal, rank, world_size, zigzag=False):   # the contiguous layout as the reference's
        return (masked if zigzag else reference.ring_attention)(q, k, v, causal, rank, world_size, zigzag)

    shard.__name__ = shard.__qualname__ = f"zigzag_shard_{name}"
    unshard.__name__ = unshard.__qualname__ = f"zigzag_unshard_{name}"
    ring.__name__ = ring.__qualname__ = f"ring_{name}"
    return shard, unshard, ring


# --- gathers-all-kv: every rank holds every chunk of keys and values ---

def ring_all_gathered(q, k, v, causal, rank, world_size, zigzag=False):
    dtype, acc = q.dtype, torch.promote_types(q.dtype, torch.float32)
    ks, vs = [torch.empty_like(k) for _ in range(world_size)], [torch.empty_like(v) for _ in range(world_size)]
    dist.all_gather(ks, k.contiguous())   # world_size chunks on every rank: the memory the ring exists to save
    dist.all_gather(vs, v.contiguous())
    return _attend_all(q.to(acc), ks, vs, causal, rank, world_size, zigzag, dtype)


def _attend_all(q, ks, vs, causal, rank, world_size, zigzag, dtype):
    """This rank's queries against every rank's keys at once (rank r's chunk at index r)."""
    T = q.size(-2)
    k, v = torch.cat(ks, dim=-2).to(q.dtype), torch.cat(vs, dim=-2).to(q.dtype)   # (B, H, W*T, hd)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))   # (B, H, T, W*T)
    if causal:
        keys = torch.cat([_global(r, world_size, T, zigzag) for r in range(world_size)])   # (W*T,)
        scores = scores.masked_fill(keys[None, :] > _global(rank, world_size, T, zigzag)[:, None], float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v).to(dtype), torch.logsumexp(scores, dim=-1).float()


ring_local_positions = _masked_ring("ring_local_positions", _local)
ring_local_key_positions = _masked_ring("ring_local_key_positions", _global, key_positions=_local)
ring_every_block_masked = _masked_ring("ring_every_block_masked", _global)
zigzag_shard_r_plus_w, zigzag_unshard_r_plus_w, ring_r_plus_w = _layout("r_plus_w", lambda r, w: (r, r + w))
zigzag_shard_mirror_first, zigzag_unshard_mirror_first, ring_mirror_first = _layout(
    "mirror_first", lambda r, w: (2 * w - 1 - r, r))


def _zigzag_bug(shard, unshard, ring):
    return {"zigzag_shard": shard, "zigzag_unshard": unshard, "ring_attention": ring}


BUGS = {
    "lse-not-rescaled": [{"ring_attention": ring_merged_by_mean}, {"ring_attention": ring_merged_by_sum}],
    "local-causal-offset": [{"ring_attention": ring_local_positions}, {"ring_attention": ring_local_key_positions}],
    "zigzag-order": [_zigzag_bug(zigzag_shard_r_plus_w, zigzag_unshard_r_plus_w, ring_r_plus_w),
                     _zigzag_bug(zigzag_shard_mirror_first, zigzag_unshard_mirror_first, ring_mirror_first)],
    "gathers-all-kv": {"ring_attention": ring_all_gathered},
    "computes-masked-blocks": {"ring_attention": ring_every_block_masked},
    "no-scaling": {"ring_attention": ring_unscaled},
    "double-scale": {"ring_attention": ring_scaled_twice},
    "softmax-wrong-dim": {"ring_attention": ring_softmax_over_queries},
}
