"""Megatron-LM's idiom with its _reduce averaging the partial outputs (ReduceOp.AVG, as a
data-parallel gradient all-reduce would) where they must be summed."""
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def divide(numerator, denominator):
    if numerator % denominator != 0:
        raise ValueError(f"{numerator} is not divisible by {denominator}")
    return numerator // denominator


def _reduce(input_):
    """All-reduce the input tensor across the model-parallel group (no autograd function: inference)."""
    if dist.get_world_size() == 1:
        return input_
    dist.all_reduce(input_, op=dist.ReduceOp.AVG)
    return input_


def shard_qkv(weight, bias, n_heads, n_kv_heads, rank, world_size):
    heads_per_partition = divide(n_heads, world_size)
    if n_kv_heads >= world_size:
        groups_per_partition = divide(n_kv_heads, world_size)
        group_start = rank * groups_per_partition
    else:
        replicas = divide(world_size, n_kv_heads)
        groups_per_partition, group_start = 1, rank // replicas
    head_dim = weight.size(0) // (n_heads + 2 * n_kv_heads)
    q_size, kv_size = n_heads * head_dim, n_kv_heads * head_dim
    q_start = rank * heads_per_partition * head_dim
    q = slice(q_start, q_start + heads_per_partition * head_dim)
    k = slice(q_size + group_start * head_dim, q_size + (group_start + groups_per_partition) * head_dim)
    v = slice(k.start + kv_size, k.stop + kv_size)
    w = torch.cat([weight[q], weight[k], weight[v]], dim=0)
    b = torch.cat([bias[q], bias[k], bias[v]], dim=0)
    return w, b


def shard_out(weight, rank, world_size):
    per_partition = divide(weight.size(1), world_size)
    return weight[:, rank * per_partition:(rank + 1) * per_partition].clone()


class ColumnParallelLinear(nn.Module):
    """Y = XA + b with A split along its output dimension: this rank's rows, no gather of the output."""

    def __init__(self, weight, bias):
        super().__init__()
        self.weight = nn.Parameter(weight.clone())
        self.bias = nn.Parameter(bias.clone())

    def forward(self, input_):
        return F.linear(input_, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Y = XA + b with A split along its input dimension: partial products all-reduced, then the bias."""

    def __init__(self, weight, bias):
        super().__init__()
        self.weight = nn.Parameter(weight.clone())
        self.bias = nn.Parameter(bias.clone())

    def forward(self, input_parallel):
        output_parallel = F.linear(input_parallel, self.weight)
        output_ = _reduce(output_parallel)
        return output_ + self.bias


class TensorParallelAttention(nn.Module):
    def __init__(self, state_dict, n_heads, n_kv_heads, rank, world_size):
        super().__init__()
        w, b = shard_qkv(state_dict["c_attn.weight"], state_dict["c_attn.bias"], n_heads, n_kv_heads, rank, world_size)
        self.hidden_size_per_attention_head = state_dict["c_proj.weight"].size(0) // n_heads
        self.num_attention_heads_per_partition = divide(n_heads, world_size)
        self.num_query_groups_per_partition = max(n_kv_heads // world_size, 1)
        self.query_key_value = ColumnParallelLinear(w, b)
        self.dense = RowParallelLinear(shard_out(state_dict["c_proj.weight"], rank, world_size), state_dict["c_proj.bias"])
        self.norm_factor = math.sqrt(self.hidden_size_per_attention_head)

    def forward(self, hidden_states):
        b, s, _ = hidden_states.shape
        hn = self.hidden_size_per_attention_head
        np_, ng = self.num_attention_heads_per_partition, self.num_query_groups_per_partition
        mixed_x_layer = self.query_key_value(hidden_states)
        query, key, value = torch.split(mixed_x_layer, [np_ * hn, ng * hn, ng * hn], dim=-1)
        query = query.view(b, s, np_, hn).transpose(1, 2)
        key = key.view(b, s, ng, hn).transpose(1, 2).repeat_interleave(np_ // ng, dim=1)
        value = value.view(b, s, ng, hn).transpose(1, 2).repeat_interleave(np_ // ng, dim=1)
        attention_scores = torch.matmul(query, key.transpose(-1, -2)) / self.norm_factor
        causal = torch.ones(s, s, dtype=torch.bool, device=hidden_states.device).tril()
        attention_scores = attention_scores.masked_fill(~causal, float("-inf"))
        attention_probs = F.softmax(attention_scores, dim=-1)
        context_layer = torch.matmul(attention_probs, value).transpose(1, 2).reshape(b, s, np_ * hn)
        return self.dense(context_layer)
