"""Known tensor-parallel attention bugs, each the reference with exactly that mistake."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from reference.tp_attention import TensorParallelAttention, attend, shard_out, shard_qkv


# --- all-reduce-after-qkv: the ranks' QKV projections are summed (a second all-reduce, or the only one) ---

class QkvSummed(TensorParallelAttention):
    """Column-parallel QKV as it should be, but all-reduced like a row-parallel output: each rank's
    q, k and v become the sum of every rank's heads, then the output is all-reduced again."""

    def forward(self, x):
        qkv = self.c_attn(x)   # (B, T, local rows): this rank's heads only
        dist.all_reduce(qkv)   # sums the heads of different ranks together
        y = attend(qkv, self.n_heads, self.n_kv_heads, self.head_dim)
        out = y @ self.c_proj.weight.T
        dist.all_reduce(out)
        return out + self.c_proj.bias


class QkvRowParallel(nn.Module):
    """The QKV projection split by its input (row-parallel) and all-reduced to the full q, k, v on
    every rank; every rank then computes every head and the whole output projection: the right
    output, one all-reduce, but of the (B, T, QKV) projection, and c_proj held whole on every rank."""

    def __init__(self, state_dict, n_heads, n_kv_heads, rank, world_size):
        super().__init__()
        shard_qkv(state_dict["c_attn.weight"], state_dict["c_attn.bias"], n_heads, n_kv_heads, rank, world_size)   # checks the split
        w = state_dict["c_attn.weight"]   # (QKV, C)
        self.rank, self.world_size = rank, world_size
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, w.shape[1] // n_heads
        like = {"dtype": w.dtype, "device": w.device}
        self.c_attn = nn.Linear(w.shape[1] // world_size, w.shape[0], **like)   # this rank's input columns
        self.c_proj = nn.Linear(w.shape[1], w.shape[1], **like)                  # whole
        with torch.no_grad():
            self.c_attn.weight.copy_(w.chunk(world_size, dim=1)[rank])
            self.c_attn.bias.copy_(state_dict["c_attn.bias"])
            self.c_proj.weight.copy_(state_dict["c_proj.weight"])
            self.c_proj.bias.copy_(state_dict["c_proj.bias"])

    def forward(self, x):
        qkv = x.chunk(self.world_size, dim=-1)[self.rank] @ self.c_attn.weight.T   # (B, T, QKV), partial
        dist.all_reduce(qkv)
        y = attend(qkv + self.c_attn.bias, self.n_heads, self.n_kv_heads, self.head_dim)   # every head
        return self.c_proj(y)


class QkvRowParallelThenHeads(QkvRowParallel):
    """As QkvRowParallel, then only this rank's heads and its columns of c_proj: a second all-reduce."""

    def forward(self, x):
        qkv = x.chunk(self.world_size, dim=-1)[self.rank] @ self.c_attn.weight.T
        dist.all_reduce(qkv)
        # this rank's columns of the full q, k, v: shard_qkv picks rows, so the channels go first
        qkv, b = shard_qkv(qkv.movedim(-1, 0), self.c_attn.bias, self.n_heads, self.n_kv_heads, self.rank,
                           self.world_size)
        y = attend(qkv.movedim(0, -1) + b, self.n_heads // self.world_size, max(self.n_kv_heads // self.world_size, 1),
                   self.head_dim)
        out = y @ shard_out(self.c_proj.weight, self.rank, self.world_size).T
        dist.all_reduce(out)
        return out + self.c_proj.bias


# --- fused-qkv-split-wrong: a rank's q, k and v rows do not belong together ---

def shard_qkv_chunked(weight, bias, n_heads, n_kv_heads, rank, world_size):
    """The fused [W_q; W_k; W_v] cut into world_size contiguous blocks of rows: rank 0 gets W_q's
    first rows and more of W_q where it should get k and v rows."""
    right = shard_qkv(weight, bias, n_heads, n_kv_heads, rank, world_size)
    if right[0].shape[0] * world_size != weight.shape[0]:
        return right   # replicated KV heads: a block of rows this size does not exist
    return weight.chunk(world_size)[rank].clone(), bias.chunk(world_size)[rank].clone()


class ChunkedShard(TensorParallelAttention):
    def __init__(self, state_dict, n_heads, n_kv_heads, rank, world_size):
        super().__init__(state_dict, n_heads, n_kv_heads, rank, world_size)
        w, b = shard_qkv_chunked(state_dict["c_attn.weight"], state_dict["c_attn.bias"], n_heads, n_kv_heads, rank,
                                 world_size)
        with torch.no_grad():
            self.c_attn.weight.copy_(w)
            self.c_attn.bias.copy_(b)


def shard_qkv_kv_tiled(weight, bias, n_heads, n_kv_heads, rank, world_size):
    """With fewer KV heads than ranks, rank r takes KV head r % n_kv_heads (dealt out in turn) where
    its query heads read KV head r // (world_size // n_kv_heads): q of one rank with k and v of another."""
    right = shard_qkv(weight, bias, n_heads, n_kv_heads, rank, world_size)   # raises where heads do not split
    if n_kv_heads >= world_size:
        return right
    hd = weight.shape[0] // (n_heads + 2 * n_kv_heads)
    q_heads, kv = n_heads // world_size, rank % n_kv_heads
    rows = torch.cat([torch.arange(rank * q_heads * hd, (rank + 1) * q_heads * hd),
                      n_heads * hd + torch.arange(kv * hd, (kv + 1) * hd),
                      (n_heads + n_kv_heads) * hd + torch.arange(kv * hd, (kv + 1) * hd)])
    return weight[rows].clone(), bias[rows].clone()


class KvTiledShard(ChunkedShard):
    def __init__(self, state_dict, n_heads, n_kv_heads, rank, world_size):
        TensorParallelAttention.__init__(self, state_dict, n_heads, n_kv_heads, rank, world_size)
        w, b = shard_qkv_kv_tiled(state_dict["c_attn.weight"], state_dict["c_attn.bias"], n_heads, n_kv_heads, rank,
                                  world_size)
        with torch.no_grad():
            self.c_attn.weight.copy_(w)
            self.c_attn.bias.copy_(b)


def shard_qkv_grouped(weight, bias, n_heads, n_kv_heads, rank, world_size):
    """The fused rows read in Megatron-LM's own layout, group after group: each KV group's n_rep
    query heads, then its key head, then its value head (GPT-NeoX's [q_h; k_h; v_h] without GQA),
    where they are [all q; all k; all v]: a rank's 'q' rows are partly keys and values."""
    shard_qkv(weight, bias, n_heads, n_kv_heads, rank, world_size)   # raises where heads do not split
    n_rep, hd = n_heads // n_kv_heads, weight.shape[0] // (n_heads + 2 * n_kv_heads)
    w = weight.view(n_kv_heads, n_rep + 2, hd, weight.shape[1])   # (groups, n_rep q heads + k + v, hd, C)
    b = bias.view(n_kv_heads, n_rep + 2, hd)
    q_heads = n_heads // world_size
    heads = range(rank * q_heads, (rank + 1) * q_heads)
    first = rank * q_heads // n_rep
    groups = range(first, first + max(n_kv_heads // world_size, 1))
    pick = [(j // n_rep, j % n_rep) for j in heads] + [(g, n_rep) for g in groups] + [(g, n_rep + 1) for g in groups]
    return torch.cat([w[i, r] for i, r in pick]), torch.cat([b[i, r] for i, r in pick])


class GroupedShard(ChunkedShard):
    def __init__(self, state_dict, n_heads, n_kv_heads, rank, world_size):
        TensorParallelAttention.__init__(self, state_dict, n_heads, n_kv_heads, rank, world_size)
        w, b = shard_qkv_grouped(state_dict["c_attn.weight"], state_dict["c_attn.bias"], n_heads, n_kv_heads, rank,
                                  world_size)
        with torch.no_grad():
            self.c_attn.weight.copy_(w)
            self.c_attn.bias.copy_(b)


# --- bias-before-all-reduce: c_proj's bias added on every rank, then summed world_size times ---

class BiasInLinear(TensorParallelAttention):
    def forward(self, x):
        y = attend(self.c_attn(x), self.n_heads, self.n_kv_heads, self.head_dim)
        out = self.c_proj(y)   # nn.Linear adds the whole bias on every rank
        dist.all_reduce(out)
        return out


class BiasAddedThenReduced(TensorParallelAttention):
    def forward(self, x):
        y = attend(self.c_attn(x), self.n_heads, self.n_kv_heads, self.head_dim)
        out = F.linear(y, self.c_proj.weight) + self.c_proj.bias   # every rank adds it
        dist.all_reduce(out)
        return out


# --- all-reduce-result-assigned: all_reduce's return value taken for the sum (it returns None) ---

class ResultAssigned(TensorParallelAttention):
    def forward(self, x):
        y = attend(self.c_attn(x), self.n_heads, self.n_kv_heads, self.head_dim)
        out = F.linear(y, self.c_proj.weight, self.c_proj.bias if dist.get_rank() == 0 else None)
        out = dist.all_reduce(out)   # sums out in place and returns None
        return out


# --- all-reduce-averaged: the shares averaged (ReduceOp.AVG) where they must be summed ---

class Averaged(TensorParallelAttention):
    def forward(self, x):
        y = attend(self.c_attn(x), self.n_heads, self.n_kv_heads, self.head_dim)
        out = y @ self.c_proj.weight.T
        dist.all_reduce(out, op=dist.ReduceOp.AVG)   # the sum divided by world_size
        return out + self.c_proj.bias


class AveragedBiasOnRankZero(TensorParallelAttention):
    """vLLM's bias on rank 0 before the all-reduce, then averaged: the bias divided by world_size too."""

    def forward(self, x):
        y = attend(self.c_attn(x), self.n_heads, self.n_kv_heads, self.head_dim)
        out = F.linear(y, self.c_proj.weight, self.c_proj.bias if dist.get_rank() == 0 else None)
        dist.all_reduce(out, op=dist.ReduceOp.AVG)
        return out


# --- all-reduce-not-waited: an async all-reduce whose work is never waited on ---

class NotWaited(TensorParallelAttention):
    def forward(self, x):
        y = attend(self.c_attn(x), self.n_heads, self.n_kv_heads, self.head_dim)
        out = y @ self.c_proj.weight.T
        dist.all_reduce(out, async_op=True)   # the work handle dropped: out is read before the sum lands
        return out + self.c_proj.bias


# --- collective-on-some-ranks: a collective that not every rank calls ---

class ReducedOnRankZero(TensorParallelAttention):
    def forward(self, x):
        y = attend(self.c_attn(x), self.n_heads, self.n_kv_heads, self.head_dim)
        out = y @ self.c_proj.weight.T
        if dist.get_rank() == 0:   # rank 0 waits for ranks that never call it
            dist.all_reduce(out)
        return out + self.c_proj.bias


BUGS = {
    "all-reduce-after-qkv": [{"TensorParallelAttention": QkvSummed},
                             {"TensorParallelAttention": QkvRowParallel},
                             {"TensorParallelAttention": QkvRowParallelThenHeads}],
    "fused-qkv-split-wrong": [{"shard_qkv": shard_qkv_chunked, "TensorParallelAttention": ChunkedShard},
                              {"shard_qkv": shard_qkv_kv_tiled, "TensorParallelAttention": KvTiledShard},
                              {"shard_qkv": shard_qkv_grouped, "TensorParallelAttention": GroupedShard}],
    "bias-before-all-reduce": [{"TensorParallelAttention": BiasInLinear},
                               {"TensorParallelAttention": BiasAddedThenReduced}],
    "all-reduce-result-assigned": {"TensorParallelAttention": ResultAssigned},
    "all-reduce-averaged": [{"TensorParallelAttention": Averaged},
                            {"TensorParallelAttention": AveragedBiasOnRankZero}],
    "all-reduce-not-waited": {"TensorParallelAttention": NotWaited},
    "collective-on-some-ranks": {"TensorParallelAttention": ReducedOnRankZero},
}
