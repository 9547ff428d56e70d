"""Ring attention (Liu, Zaharia and Abbeel, 2023) over torch.distributed: each rank keeps one chunk
of the sequence's queries, the key/value chunks travel round the ring of ranks, and each rank merges
its partial outputs by log-sum-exp, as Flash-Decoding merges its splits. The zig-zag layout is
ring-flash-attention's (zhuzilin/ring-flash-attention), which balances the causal work."""
import math

import torch
import torch.distributed as dist


def zigzag_shard(x: torch.Tensor, rank: int, world_size: int, dim: int) -> torch.Tensor:
    """Rank ``rank``'s zig-zag shard of the full sequence ``x``.

    ``x`` is cut into 2 * world_size equal chunks along ``dim`` (its length must divide evenly);
    the rank keeps chunks ``rank`` and ``2 * world_size - 1 - rank``, concatenated in that order
    along ``dim``: one early and one late chunk, so that under a causal mask every rank has the same
    work. Returns a new tensor of x's dtype whose length along ``dim`` is x's / world_size.
    """
    chunks = x.chunk(2 * world_size, dim=dim)   # 2W chunks of T / 2W positions
    return torch.cat([chunks[rank], chunks[2 * world_size - 1 - rank]], dim=dim)


def zigzag_unshard(chunks, world_size: int, dim: int) -> torch.Tensor:
    """The full sequence back from every rank's zig-zag shard.

    ``chunks``: a list of world_size tensors, rank r's shard at index r (what zigzag_shard gave
    it, or an output computed in that layout). Returns the tensor whose zigzag_shard for each rank
    is ``chunks[rank]``: the first halves in rank order, then the second halves in reverse rank order.
    """
    halves = [shard.chunk(2, dim=dim) for shard in chunks]   # rank r: (chunk r, chunk 2W-1-r)
    early = [first for first, _ in halves]   # chunks 0 .. W-1
    late = [second for _, second in reversed(halves)]   # chunks W .. 2W-1
    return torch.cat(early + late, dim=dim)


def _block_attention(q, k, v, mask=None):
    """(out, lse) of queries q (B, H, Tq, hd) against one block of keys and values (B, H, Tk, hd):
    out normalised within the block, lse the log of its softmax denominator. ``mask`` (Tq, Tk) is
    True where a query may see a key; every row of it sees at least one key."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))   # (B, H, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)   # (B, H, Tq), subtracts the row's max: no overflow
    out = torch.exp(scores - lse[..., None]) @ v   # (B, H, Tq, hd), each row's weights sum to 1
    return out, lse


def _merge(out, lse, block_out, block_lse):
    """Two partials over disjoint keys merged into one: each weighed by its share of the joint
    softmax denominator, exp(lse_i - lse). Without this rescaling a sum or a mean of the partials
    is no softmax over the union."""
    new_lse = torch.logaddexp(lse, block_lse)   # (B, H, Tq) log(exp(lse) + exp(block_lse)), overflow-free
    out = torch.exp(lse - new_lse)[..., None] * out + torch.exp(block_lse - new_lse)[..., None] * block_out
    return out, new_lse   # (B, H, Tq, hd), (B, H, Tq)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, rank: int, world_size: int,
                   zigzag: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of softmax(q kᵀ / sqrt(head_dim)) v over the whole sequence, the key/value
    chunks passed round the ring of the default process group.

    q, k, v ``(B, H, T_local, head_dim)``: this rank's chunk of the sequence, positions
    ``rank * T_local ..`` (contiguous), or with ``zigzag=True`` chunks ``rank`` and
    ``2 * world_size - 1 - rank`` of 2 * world_size (zigzag_shard's layout; T_local even). With
    ``causal`` a query sees the keys at global positions up to its own. Each step sends the chunk
    in hand to rank + 1 and receives the next from rank - 1 (world_size - 1 transfers), holding at
    most two chunks at once. Returns ``(out, lse)``: out like q, lse float32 ``(B, H, T_local)``,
    the natural log of each query's softmax denominator over all its keys.
    """
    dtype, acc = q.dtype, torch.promote_types(q.dtype, torch.float32)   # partials never kept in half precision
    q, k, v = q.to(acc), k.contiguous(), v.contiguous()   # send and recv need contiguous buffers
    T, half = q.size(-2), q.size(-2) // 2
    local = torch.arange(T, device=q.device)   # (T,)
    if zigzag:   # chunk `rank`, then chunk 2W-1-rank, each `half` long
        pos = torch.where(local < half, rank * half + local, (2 * world_size - 1 - rank) * half + local - half)
    else:
        pos = rank * T + local   # (T,) the global positions of this rank's queries and keys
    send_to, recv_from = (rank + 1) % world_size, (rank - 1) % world_size
    out = lse = None
    for step in range(world_size):
        if step + 1 < world_size:   # start the next chunk's transfer: it overlaps this block's compute
            next_k, next_v = torch.empty_like(k), torch.empty_like(v)
            transfers = dist.batch_isend_irecv([dist.P2POp(dist.isend, k, send_to), dist.P2POp(dist.isend, v, send_to),
                                                dist.P2POp(dist.irecv, next_k, recv_from),
                                                dist.P2POp(dist.irecv, next_v, recv_from)])
        src = (rank - step) % world_size   # the rank whose chunk k, v hold now
        rows, keys, mask = slice(None), slice(None), None   # the block of scores to compute
        if causal and step == 0:   # our own chunk: the causal mask of its global positions
            mask = pos[None, :] <= pos[:, None]   # (T, T) True where the query may see the key
        elif causal and not zigzag and src > rank:   # a later chunk: every key after every query
            rows = None
        elif causal and zigzag and src < rank:   # its early chunk precedes both of ours, its late one follows
            keys = slice(None, half)
        elif causal and zigzag:   # both its chunks fall between our early and late one
            rows = slice(half, None)
        if rows is not None:   # blocks above the diagonal are never computed
            block_out, block_lse = _block_attention(q[..., rows, :], k[..., keys, :].to(acc), v[..., keys, :].to(acc),
                                                   mask)
            if out is None:
                out, lse = block_out, block_lse   # (B, H, T, hd), (B, H, T)
            else:
                out[..., rows, :], lse[..., rows] = _merge(out[..., rows, :], lse[..., rows], block_out, block_lse)
        if step + 1 < world_size:   # the next chunk must have arrived (and ours left) before it is used
            for transfer in transfers:
                transfer.wait()
            k, v = next_k, next_v
    return out.to(dtype), lse.float()
