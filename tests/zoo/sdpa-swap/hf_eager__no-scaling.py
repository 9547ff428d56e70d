"""Hugging Face style, with the eager path's scores never multiplied by `scaling`: the flash path
(SDPA scales by itself) and the manual one then disagree."""
import torch
from torch import nn


def eager_attention_forward(query, key, value, attention_mask, scaling, dropout, training):
    attn_weights = torch.matmul(query, key.transpose(2, 3))
    attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=training)
    return torch.matmul(attn_weights, value)


def sdpa_attention_forward(query, key, value, dropout, training):
    return nn.functional.scaled_dot_product_attention(query, key, value, None, dropout if training else 0.0, True)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout=0.0, flash=True):
        super().__init__()
        if n_embd % n_head != 0:
            raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        self.num_heads = n_head
        self.head_dim = n_embd // n_head
        self.scaling = self.head_dim ** -0.5
        self.dropout = dropout
        self.flash = flash
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.proj = nn.Linear(n_embd, n_embd, bias=False)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.ones(block_size, block_size, dtype=torch.bool).tril(), persistent=False)

    def forward(self, hidden_states):
        bsz, q_len, _ = hidden_states.size()
        hidden_shape = (bsz, q_len, -1, self.head_dim)
        query_states, key_states, value_states = self.qkv(hidden_states).chunk(3, dim=-1)
        query_states = query_states.view(hidden_shape).transpose(1, 2)
        key_states = key_states.view(hidden_shape).transpose(1, 2)
        value_states = value_states.view(hidden_shape).transpose(1, 2)
        if self.flash:
            attn_output = sdpa_attention_forward(query_states, key_states, value_states, self.dropout, self.training)
        else:
            min_value = torch.finfo(hidden_states.dtype).min
            causal_mask = torch.zeros(q_len, q_len, dtype=hidden_states.dtype, device=hidden_states.device)
            causal_mask = causal_mask.masked_fill(~self.mask[:q_len, :q_len], min_value)
            attn_output = eager_attention_forward(query_states, key_states, value_states, causal_mask,
                                                  self.scaling, self.dropout, self.training)
        attn_output = attn_output.transpose(1, 2).reshape(bsz, q_len, -1).contiguous()
        return self.resid_dropout(self.proj(attn_output))
