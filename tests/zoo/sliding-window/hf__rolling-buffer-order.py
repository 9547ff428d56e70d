"""Hugging Face transformers' mask functions and eager attention, with a static sliding-window
cache: a buffer of `sliding_window` slots written with `index_copy_` at `cache_position %
sliding_window`, and `update` returning every slot the buffer holds, as it lies, before the new
states (the band mask drops the one that is too old). Right until the buffer wraps; after that
slot order is not time order (rolling-buffer-order)."""
import torch
import torch.nn.functional as F


def causal_mask_function(q_idx, kv_idx):
    return kv_idx <= q_idx


def sliding_window_overlay(sliding_window):
    def inner_mask(q_idx, kv_idx):
        return kv_idx > q_idx - sliding_window
    return inner_mask


def sliding_window_mask(Tq, Tk, window, device=None):
    if window < 1:
        raise ValueError(f"`sliding_window` must be a positive integer, got {window}")
    if Tq > Tk:
        raise ValueError(f"query length {Tq} cannot exceed key length {Tk}")
    cache_position = torch.arange(Tk - Tq, Tk, device=device)
    q_idx, kv_idx = cache_position[:, None], torch.arange(Tk, device=device)[None, :]
    return causal_mask_function(q_idx, kv_idx) & sliding_window_overlay(window)(q_idx, kv_idx)


def sliding_window_attention(q, k, v, window):
    scaling = q.shape[-1] ** -0.5
    attn_weights = torch.matmul(q, k.transpose(2, 3)) * scaling
    mask = sliding_window_mask(q.shape[-2], k.shape[-2], window, device=q.device)
    attn_weights = attn_weights.masked_fill(~mask, torch.finfo(attn_weights.dtype).min)
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(attn_weights, v)


class RollingKVCache:
    def __init__(self, window):
        if window < 1:
            raise ValueError(f"`sliding_window` must be a positive integer, got {window}")
        self.sliding_window = window
        self.key_cache = self.value_cache = None
        self.cumulative_length = 0

    def __len__(self):
        return self.cumulative_length

    def append(self, key_states, value_states):
        if self.key_cache is None:
            batch, heads, _, head_dim = key_states.shape
            self.key_cache = key_states.new_zeros(batch, heads, self.sliding_window, head_dim)
            self.value_cache = value_states.new_zeros(batch, heads, self.sliding_window, value_states.shape[-1])
        filled = min(self.cumulative_length, self.sliding_window)
        full_key_states = torch.cat([self.key_cache[:, :, :filled], key_states], dim=-2)
        full_value_states = torch.cat([self.value_cache[:, :, :filled], value_states], dim=-2)
        new = key_states.shape[-2]
        keep = min(new, self.sliding_window)
        cache_position = torch.arange(self.cumulative_length + new - keep, self.cumulative_length + new,
                                      device=key_states.device)
        self.key_cache.index_copy_(2, cache_position % self.sliding_window, key_states[:, :, new - keep:])
        self.value_cache.index_copy_(2, cache_position % self.sliding_window, value_states[:, :, new - keep:])
        self.cumulative_length += new
        return full_key_states, full_value_states
