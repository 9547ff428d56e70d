import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def attend(qkv: torch.Tensor, n_heads: int, n_kv_heads: int, head_dim: int) -> torch.Tensor:
    """Causal attention of fused projections: qkv (B, T, (n_heads + 2*n_kv_heads)*head_dim), laid out
    [q heads; k heads; v heads] -> (B, T, n_heads*head_dim), query head j reading KV head
    j // (n_heads // n_kv_heads). Each rank runs it on its own heads.
    """
    B, T, _ = qkv.shape
    q, k, v = qkv.split([n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim], dim=-1)
    q = q.view(B, T, n_heads, head_dim).transpose(1, 2)      # (B, H, T, hd)
    k = k.view(B, T, n_kv_heads, head_dim).transpose(1, 2)   # (B, Hkv, T, hd)
    v = v.view(B, T, n_kv_heads, head_dim).transpose(1, 2)   # (B, Hkv, T, hd)
    n_rep = n_heads // n_kv_heads
    k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)   # (B, H, T, hd)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)   # (B, H, T, T)
    allowed = torch.ones(T, T, dtype=torch.bool, device=qkv.device).tril()   # (T, T), True = may attend
    att = F.softmax(att.masked_fill(~allowed, float("-inf")), dim=-1)
    return (att @ v).transpose(1, 2).reshape(B, T, n_heads * head_dim)   # (B, T, H*hd)


def shard_qkv(weight: torch.Tensor, bias: torch.Tensor, n_heads: int, n_kv_heads: int, rank: int,
              world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of the fused c_attn (column-parallel): its n_heads // world_size query heads,
    then its key heads, then its value heads, as ``(weight_rows, bias_rows)`` in the same [q; k; v]
    layout. With n_kv_heads >= world_size each rank gets n_kv_heads // world_size KV heads; with
    fewer KV heads than ranks each rank gets the one KV head its query heads read (replicated on
    world_size // n_kv_heads ranks). Raises ValueError unless world_size divides n_heads and
    n_kv_heads divides world_size or world_size divides n_kv_heads.
    """
    # head_dim = weight.shape[0] // (n_heads + 2 * n_kv_heads); query head j reads KV head j // n_rep.
    raise NotImplementedError("write shard_qkv")


def shard_out(weight: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's input columns of c_proj's weight (row-parallel): (d_model, d_model // world_size),
    the columns that multiply this rank's heads' outputs."""
    raise NotImplementedError("write shard_out")


class TensorParallelAttention(nn.Module):
    """Megatron-style tensor-parallel CausalSelfAttention: this rank holds its heads' rows of c_attn
    (column-parallel) and their columns of c_proj (row-parallel), computes its heads' attention, and
    one all-reduce (sum) over the default process group adds the ranks' partial outputs.
    ``state_dict`` holds the full module's ``c_attn.weight``, ``c_attn.bias``, ``c_proj.weight`` and
    ``c_proj.bias``. c_proj's bias, kept whole on every rank, counts once in the output: added after
    the all-reduce, or before it on one rank only.
    """

    def __init__(self, state_dict: dict, n_heads: int, n_kv_heads: int, rank: int, world_size: int):
        """Shards the full weights for ``rank`` of ``world_size`` (ValueError when they do not split)."""
        super().__init__()
        # this rank's c_attn rows (shard_qkv) and c_proj columns (shard_out) as nn.Linear layers or
        # nn.Parameters, in the weights' dtype; c_proj's bias whole
        raise NotImplementedError("write TensorParallelAttention.__init__")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, d_model), the same on every rank -> the full (B, T, d_model) on every rank."""
        # attend() on this rank's heads, its share of c_proj, ONE dist.all_reduce, the bias once
        raise NotImplementedError("write TensorParallelAttention.forward")
