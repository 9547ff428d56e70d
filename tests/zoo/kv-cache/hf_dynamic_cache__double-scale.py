"""Hugging Face's cache and attention with the queries scaled at their projection, as BART's
attention does (`self.q_proj(hidden_states) * self.scaling`), and the scores scaled again, as
Llama's eager_attention_forward does: divided by head_dim in all (double-scale)."""
import torch
from torch import nn


class KVCache:
    def __init__(self):
        self.key_cache, self.value_cache = None, None

    def update(self, key_states, value_states):
        if self.key_cache is None:
            self.key_cache, self.value_cache = key_states, value_states
        else:
            self.key_cache = torch.cat([self.key_cache, key_states], dim=-2)
            self.value_cache = torch.cat([self.value_cache, value_states], dim=-2)
        return self.key_cache, self.value_cache

    append = update

    def get_seq_length(self):
        return 0 if self.key_cache is None else self.key_cache.shape[-2]

    def reset(self):
        self.key_cache, self.value_cache = None, None

    def __len__(self):
        return self.get_seq_length()


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        self.head_dim = d_model // n_heads
        if self.head_dim * n_heads != d_model or n_heads % n_kv_heads != 0:
            raise ValueError(f"hidden_size {d_model}, num_attention_heads {n_heads}, num_key_value_heads {n_kv_heads}")
        self.num_heads, self.num_key_value_heads = n_heads, n_kv_heads
        self.num_key_value_groups = n_heads // n_kv_heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=False)

    def forward(self, x, cache=None, start_pos=0):
        past_seen_tokens = cache.get_seq_length() if cache is not None else 0
        if start_pos != past_seen_tokens:
            raise ValueError(f"start_pos ({start_pos}) must equal the cache's length ({past_seen_tokens})")
        input_shape = x.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = (self.q_proj(x) * self.scaling).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(x).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(x).view(hidden_shape).transpose(1, 2)
        if cache is not None:
            key_states, value_states = cache.update(key_states, value_states)
        T, Tk = query_states.shape[-2], key_states.shape[-2]
        cache_position = torch.arange(past_seen_tokens, past_seen_tokens + T, device=x.device)
        min_dtype = torch.finfo(x.dtype).min
        causal_mask = torch.full((T, Tk), fill_value=min_dtype, dtype=x.dtype, device=x.device)
        causal_mask = causal_mask * (torch.arange(Tk, device=x.device) > cache_position.reshape(-1, 1))
        key_states = repeat_kv(key_states, self.num_key_value_groups)
        value_states = repeat_kv(value_states, self.num_key_value_groups)
        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) * self.scaling
        attn_weights = attn_weights + causal_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).contiguous()
        return self.o_proj(attn_output.reshape(*input_shape, -1).contiguous())
