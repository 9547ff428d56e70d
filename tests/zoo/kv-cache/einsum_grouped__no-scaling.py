"""The einsum idiom with the scores left unscaled: `torch.einsum("bqgrd,bgkd->bgrqk", q, k)` is
the whole score, never divided by sqrt(head_dim) (no-scaling). Decoding agrees with the module's
own full forward; both are too sharp."""
import torch
import torch.nn as nn


class KVCache:
    def __init__(self):
        self.k = self.v = None

    def append(self, k, v):
        if self.k is None:
            self.k, self.v = k[:, :, :0], v[:, :, :0]
        self.k = torch.cat([self.k, k], dim=-2)
        self.v = torch.cat([self.v, v], dim=-2)
        return self.k, self.v

    def reset(self):
        self.k = self.v = None

    def __len__(self):
        return 0 if self.k is None else self.k.shape[-2]


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}")
        self.g, self.r, self.hd = n_kv_heads, n_heads // n_kv_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, cache=None, start_pos=0):
        n_cached = 0 if cache is None else len(cache)
        if start_pos != n_cached:
            raise ValueError(f"start_pos={start_pos} != len(cache)={n_cached}")
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.g, self.r, self.hd)
        k = self.k_proj(x).view(B, T, self.g, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.g, self.hd).transpose(1, 2)
        if cache is not None:
            k, v = cache.append(k, v)
        Tk = k.shape[-2]
        scores = torch.einsum("bqgrd,bgkd->bgrqk", q, k)
        positions = start_pos + torch.arange(T, device=x.device)
        allowed = torch.arange(Tk, device=x.device)[None, :] <= positions[:, None]
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        y = torch.einsum("bgrqk,bgkd->bqgrd", weights, v)
        return self.o_proj(y.reshape(B, T, C))
