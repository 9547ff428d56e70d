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
    raise NotImplementedError("write zigzag_shard")


def zigzag_unshard(chunks, world_size: int, dim: int) -> torch.Tensor:
    """The full sequence back from every rank's zig-zag shard.

    ``chunks``: a list of world_size tensors, rank r's shard at index r (what zigzag_shard gave
    it, or an output computed in that layout). Returns the tensor whose zigzag_shard for each rank
    is ``chunks[rank]``: the first halves in rank order, then the second halves in reverse rank order.
    """
    raise NotImplementedError("write zigzag_unshard")


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
    raise NotImplementedError("write ring_attention")
