"""Hugging Face's eager attention with the dropout probability passed whatever the mode and
`training` left out of F.dropout, whose default is True: it drops in eval mode too."""
import torch
from torch import nn


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0):
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout)
    attn_output = torch.matmul(attn_weights, value)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        self.num_heads = n_heads
        self.head_dim = d_model // n_heads
        self.scaling = self.head_dim ** -0.5
        self.attention_dropout = dropout
        self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=True)
        self.out_proj = nn.Linear(d_model, d_model, bias=True)

    def forward(self, x, causal=False):
        bsz, q_len, _ = x.size()
        hidden_shape = (bsz, q_len, -1, self.head_dim)
        query_states, key_states, value_states = self.qkv_proj(x).chunk(3, dim=-1)
        query_states = query_states.view(hidden_shape).transpose(1, 2)
        key_states = key_states.view(hidden_shape).transpose(1, 2)
        value_states = value_states.view(hidden_shape).transpose(1, 2)
        attention_mask = None
        if causal:
            min_value = torch.finfo(x.dtype).min
            attention_mask = torch.full((q_len, q_len), min_value, dtype=x.dtype, device=x.device).triu(1)
        attn_output, attn_weights = eager_attention_forward(
            self, query_states, key_states, value_states, attention_mask, self.scaling,
            dropout=self.attention_dropout)
        attn_output = attn_output.reshape(bsz, q_len, -1).contiguous()
        return self.out_proj(attn_output), attn_weights
