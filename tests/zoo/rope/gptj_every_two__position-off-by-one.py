"""GPT-J's attention with the table's rows taken one past the cache: `embed_positions[past + 1: past + 1 + T]`,
the new tokens counted from past + 1 as if the first of them were the (past + 1)-th, so the first token of
a prompt gets position 1's angles and every query and key its neighbour's."""
import math

import torch
import torch.nn as nn


def create_sinusoidal_positions(num_pos, dim, base=10000.0):
    if dim % 2:
        raise ValueError(f"rotary dimension {dim} is odd")
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64) / dim))
    sinusoid_inp = torch.einsum("i , j -> i j", torch.arange(num_pos, dtype=torch.int64).float(), inv_freq).float()
    return torch.cat((torch.sin(sinusoid_inp), torch.cos(sinusoid_inp)), dim=1)


def rotate_every_two(x):
    x1 = x[:, :, :, ::2]
    x2 = x[:, :, :, 1::2]
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)


def apply_rotary_pos_emb(tensor, sin, cos):
    sin = torch.repeat_interleave(sin[:, :, None, :], 2, 3)
    cos = torch.repeat_interleave(cos[:, :, None, :], 2, 3)
    return (tensor * cos) + (rotate_every_two(tensor) * sin)


def rope_cache(T, head_dim, base=10000.0, dtype=torch.float32):
    sincos = create_sinusoidal_positions(T, head_dim, base)
    sin, cos = torch.split(sincos, head_dim // 2, dim=-1)
    return cos.to(dtype), sin.to(dtype)


def apply_rope(x, cos, sin, positions):
    out = apply_rotary_pos_emb(x.permute(0, 2, 1, 3), sin[positions][None], cos[positions][None])   # (B, T, H, hd)
    return out.permute(0, 2, 1, 3).to(x.dtype)


class RoPEAttention(nn.Module):
    def __init__(self, d_model, n_heads, max_len=2048, base=10000.0):
        super().__init__()
        self.num_attention_heads = n_heads
        self.head_dim = d_model // n_heads
        if self.head_dim * n_heads != d_model:
            raise ValueError(f"embed_dim must be divisible by num_attention_heads (got {d_model} and {n_heads})")
        self.register_buffer("bias", torch.tril(torch.ones((max_len, max_len), dtype=torch.bool)), persistent=False)
        self.embed_positions = create_sinusoidal_positions(max_len, self.head_dim, base)
        self.scale_attn = math.sqrt(self.head_dim)
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def _split_heads(self, tensor):
        return tensor.view(tensor.size()[:-1] + (self.num_attention_heads, self.head_dim))

    def forward(self, hidden_states, past_kv=None):
        B, T, C = hidden_states.shape
        past = 0 if past_kv is None else past_kv[0].size(-2)
        query = self._split_heads(self.q_proj(hidden_states))
        key = self._split_heads(self.k_proj(hidden_states))
        value = self._split_heads(self.v_proj(hidden_states)).permute(0, 2, 1, 3)
        embed_positions = self.embed_positions.to(hidden_states.device)
        sincos = embed_positions[past + 1: past + 1 + T][None]
        sin, cos = torch.split(sincos, self.head_dim // 2, dim=-1)
        key = apply_rotary_pos_emb(key, sin, cos).to(hidden_states.dtype).permute(0, 2, 1, 3)
        query = apply_rotary_pos_emb(query, sin, cos).to(hidden_states.dtype).permute(0, 2, 1, 3)
        if past_kv is not None:
            key = torch.cat((past_kv[0], key), dim=-2)
            value = torch.cat((past_kv[1], value), dim=-2)
        key_length = key.size(-2)
        causal_mask = self.bias[key_length - T: key_length, :key_length]
        attn_weights = torch.matmul(query, key.transpose(-1, -2)) / self.scale_attn
        attn_weights = torch.where(causal_mask, attn_weights, torch.finfo(attn_weights.dtype).min)
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_output = torch.matmul(attn_weights, value)
        attn_output = attn_output.permute(0, 2, 1, 3).contiguous().view(B, T, C)
        return self.o_proj(attn_output), (key, value)
