"""Hugging Face's eager Llama attention with the scale taken from the hidden size:
`self.scaling = hidden_size ** -0.5` instead of `head_dim ** -0.5`.
"""
import torch
from torch import nn


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"hidden_size ({d_model}) must be divisible by num_attention_heads ({n_heads})")
        if n_heads % n_kv_heads != 0:
            raise ValueError(f"num_attention_heads ({n_heads}) must be divisible by num_key_value_heads ({n_kv_heads})")
        self.head_dim = d_model // n_heads
        self.num_key_value_groups = n_heads // n_kv_heads
        self.scaling = d_model ** -0.5
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=False)

    def forward(self, hidden_states, causal=True):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)

        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        key_states = repeat_kv(key_states, self.num_key_value_groups)
        value_states = repeat_kv(value_states, self.num_key_value_groups)

        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) * self.scaling
        if causal:
            seq_len = query_states.shape[-2]
            min_dtype = torch.finfo(attn_weights.dtype).min
            causal_mask = torch.full((seq_len, seq_len), min_dtype, dtype=attn_weights.dtype,
                                     device=attn_weights.device).triu(1)
            attn_weights = attn_weights + causal_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).contiguous()
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output)
