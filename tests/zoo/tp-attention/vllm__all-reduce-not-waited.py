"""vLLM's idiom with an async all-reduce helper that drops its work handle: the output is read
before the sum lands."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def divide(numerator, denominator):
    if numerator % denominator != 0:
        raise ValueError(f"{numerator} is not divisible by {denominator}")
    return numerator // denominator


def tensor_model_parallel_all_reduce(input_):
    dist.all_reduce(input_, async_op=True)
    return input_


class QKVParallelLinear(nn.Module):
    def __init__(self, hidden_size, head_size, total_num_heads, total_num_kv_heads, tp_rank, tp_size, dtype):
        super().__init__()
        self.head_size, self.tp_rank = head_size, tp_rank
        self.total_num_heads, self.total_num_kv_heads = total_num_heads, total_num_kv_heads
        self.num_heads = divide(total_num_heads, tp_size)
        if tp_size >= total_num_kv_heads:
            self.num_kv_heads = 1
            self.num_kv_head_replicas = divide(tp_size, total_num_kv_heads)
        else:
            self.num_kv_heads = divide(total_num_kv_heads, tp_size)
            self.num_kv_head_replicas = 1
        output_size = (self.num_heads + 2 * self.num_kv_heads) * head_size
        self.weight = nn.Parameter(torch.empty(output_size, hidden_size, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(output_size, dtype=dtype), requires_grad=False)

    def _shard(self, loaded_shard_id):
        """(offset in this rank's param, size, offset in the full checkpoint tensor) of a shard."""
        q, kv = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        if loaded_shard_id == "q":
            return 0, q, self.tp_rank * q
        shard_id = self.tp_rank // self.num_kv_head_replicas
        base = self.total_num_heads * self.head_size
        if loaded_shard_id == "k":
            return q, kv, base + shard_id * kv
        return q + kv, kv, base + self.total_num_kv_heads * self.head_size + shard_id * kv

    def weight_loader(self, param, loaded_weight, loaded_shard_id):
        offset, size, start = self._shard(loaded_shard_id)
        param.data.narrow(0, offset, size).copy_(loaded_weight.narrow(0, start, size))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    def __init__(self, input_size, output_size, tp_rank, tp_size, dtype):
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.input_size_per_partition = divide(input_size, tp_size)
        self.weight = nn.Parameter(torch.empty(output_size, self.input_size_per_partition, dtype=dtype),
                                   requires_grad=False)
        self.bias = nn.Parameter(torch.empty(output_size, dtype=dtype), requires_grad=False)

    def weight_loader(self, param, loaded_weight):
        if param is self.bias:
            param.data.copy_(loaded_weight)
            return
        size = self.input_size_per_partition
        param.data.copy_(loaded_weight.narrow(1, self.tp_rank * size, size))

    def forward(self, input_parallel):
        # Only fuse bias add into GEMM for rank 0 (this ensures that bias will not get added more than once in TP>1 case)
        bias_ = None if self.tp_rank > 0 else self.bias
        output_parallel = F.linear(input_parallel, self.weight, bias_)
        return tensor_model_parallel_all_reduce(output_parallel)


def shard_qkv(weight, bias, n_heads, n_kv_heads, rank, world_size):
    if n_kv_heads % world_size != 0 and world_size % n_kv_heads != 0:
        raise ValueError(f"{n_kv_heads} KV heads over {world_size} ranks")
    head_size = weight.shape[0] // (n_heads + 2 * n_kv_heads)
    layer = QKVParallelLinear(weight.shape[1], head_size, n_heads, n_kv_heads, rank, world_size, weight.dtype)
    for shard_id in ("q", "k", "v"):
        layer.weight_loader(layer.weight, weight, shard_id)
        layer.weight_loader(layer.bias, bias, shard_id)
    return layer.weight.data, layer.bias.data


def shard_out(weight, rank, world_size):
    layer = RowParallelLinear(weight.shape[1], weight.shape[0], rank, world_size, weight.dtype)
    layer.weight_loader(layer.weight, weight)
    return layer.weight.data


class TensorParallelAttention(nn.Module):
    def __init__(self, state_dict, n_heads, n_kv_heads, rank, world_size):
        super().__init__()
        w = state_dict["c_attn.weight"]
        hidden_size = w.shape[1]
        self.head_dim = hidden_size // n_heads
        if n_kv_heads % world_size != 0 and world_size % n_kv_heads != 0:
            raise ValueError(f"{n_kv_heads} KV heads over {world_size} ranks")
        self.qkv_proj = QKVParallelLinear(hidden_size, self.head_dim, n_heads, n_kv_heads, rank, world_size, w.dtype)
        for shard_id in ("q", "k", "v"):
            self.qkv_proj.weight_loader(self.qkv_proj.weight, w, shard_id)
            self.qkv_proj.weight_loader(self.qkv_proj.bias, state_dict["c_attn.bias"], shard_id)
        self.o_proj = RowParallelLinear(hidden_size, hidden_size, rank, world_size, w.dtype)
        self.o_proj.weight_loader(self.o_proj.weight, state_dict["c_proj.weight"])
        self.o_proj.weight_loader(self.o_proj.bias, state_dict["c_proj.bias"])
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.scaling = self.head_dim ** -0.5

    def forward(self, hidden_states):
        B, T, _ = hidden_states.shape
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        n_rep = self.num_heads // self.num_kv_heads
        k = k[:, :, None].expand(B, self.num_kv_heads, n_rep, T, self.head_dim).reshape(B, self.num_heads, T, -1)
        v = v[:, :, None].expand(B, self.num_kv_heads, n_rep, T, self.head_dim).reshape(B, self.num_heads, T, -1)
        scores = (q @ k.transpose(-2, -1)) * self.scaling
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        attn_output = (probs @ v).transpose(1, 2).reshape(B, T, self.q_size)
        return self.o_proj(attn_output)
