"""Hugging Face's style with the queries numbered from 0 (`torch.arange(Tq)`) instead of by
`cache_position`: right for a square mask, a top-left band once there are fewer queries than keys."""
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
    cache_position = torch.arange(Tq, device=device)
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
        self.keys = self.values = None
        self.cumulative_length = 0

    def __len__(self):
        return self.cumulative_length

    def append(self, key_states, value_states):
        self.cumulative_length += key_states.shape[-2]
        if self.keys is None:
            full_key_states, full_value_states = key_states, value_states
        else:
            full_key_states = torch.cat([self.keys, key_states], dim=-2)
            full_value_states = torch.cat([self.values, value_states], dim=-2)
        keep = full_key_states.shape[-2] - (self.sliding_window - 1)   # the last window - 1, none for a window of 1
        self.keys = full_key_states[:, :, max(keep, 0):, :]
        self.values = full_value_states[:, :, max(keep, 0):, :]
        return full_key_states, full_value_states
