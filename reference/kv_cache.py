import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class KVCache:
    """The keys and values of every token one attention layer has seen, for decoding.

    ``append(k, v)`` takes the new tokens' keys and values, (B, n_kv_heads, t_new, head_dim) each,
    and returns every cached key and value, (B, n_kv_heads, t_old + t_new, head_dim) each, oldest
    first. ``len(cache)`` is the number of tokens cached; ``reset()`` empties the cache for a new
    sequence.
    """

    def __init__(self):
        """An empty cache: no tokens yet, ``len(cache) == 0``."""
        self.k = None
        self.v = None

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the keys and values of t_new tokens, (B, n_kv_heads, t_new, head_dim) each; return
        all of them, (B, n_kv_heads, t_old + t_new, head_dim) each, the new tokens last."""
        if self.k is None:
            self.k, self.v = k, v
        else:
            # time is axis 2 of (B, Hkv, T, hd): the new tokens go after the old ones there.
            # torch.cat allocates a new tensor and copies the whole cache at every append: O(T²)
            # bytes copied over a generation, and a shape that changes each step (no CUDA graphs).
            # Meta's Llama, gpt-fast and Hugging Face's StaticCache preallocate (B, Hkv, max_len, hd)
            # and write the new tokens at [pos:pos + t_new]; cat keeps this reference short.
            self.k = torch.cat([self.k, k], dim=2)   # (B, Hkv, t_old + t_new, hd)
            self.v = torch.cat([self.v, v], dim=2)   # (B, Hkv, t_old + t_new, hd)
        return self.k, self.v

    def reset(self) -> None:
        """Forget every token: the next append starts a new sequence."""
        self.k = self.v = None

    def __len__(self) -> int:
        """The number of tokens cached."""
        return 0 if self.k is None else self.k.shape[2]


class GroupedQueryAttention(nn.Module):
    """Causal grouped-query attention (the gqa kata's module) that decodes with a KVCache: groups
    of ``n_heads // n_kv_heads`` query heads share one key/value head, and only the
    ``n_kv_heads`` heads of keys and values are cached.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int):
        """Raises ValueError unless ``n_heads`` divides ``d_model`` and ``n_kv_heads`` divides ``n_heads``."""
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads ({n_heads}) must be divisible by n_kv_heads ({n_kv_heads})")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.n_rep = n_heads // n_kv_heads   # query heads per KV head: the group size
        # each score sums head_dim products: 1/sqrt(head_dim) keeps it at unit variance.
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, start_pos: int = 0) -> torch.Tensor:
        """x (B, T, d_model), the tokens at positions start_pos .. start_pos + T - 1 -> (B, T, d_model).

        Without a cache, x is the whole sequence and attention is causal. With one, the new keys
        and values (n_kv_heads heads, before any repeat) are appended to it, and the T queries
        attend to every cached key, query i sitting at position start_pos + i: the causal mask is
        aligned bottom-right. Raises ValueError, before touching the cache, unless start_pos equals
        len(cache) (0 without a cache).
        """
        cached = 0 if cache is None else len(cache)
        if start_pos != cached:
            raise ValueError(f"start_pos is {start_pos}, but the cache holds {cached} tokens: the new tokens "
                             f"must start right after the cached ones, at position {cached}")
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)      # (B, H, T, hd)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)   # (B, Hkv, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)   # (B, Hkv, T, hd)
        if cache is not None:
            # cached before the repeat: n_kv_heads heads per token, what GQA saves.
            k, v = cache.append(k, v)   # (B, Hkv, Tk, hd), Tk = start_pos + T
        Tk = k.shape[2]
        # repeat_interleave copies the whole cache n_rep times at every step: caching the KV heads
        # saves capacity, not the bytes read here. SDPA with enable_gqa=True, or the groups folded
        # into the query axis (q.reshape(B, Hkv, n_rep * T, hd) @ k.transpose(-2, -1), the mask
        # tiled n_rep times down the rows), reads each cached head once, with no copy.
        k = k.repeat_interleave(self.n_rep, dim=1)   # (B, H, Tk, hd): query head j reads KV head j // n_rep
        v = v.repeat_interleave(self.n_rep, dim=1)   # (B, H, Tk, hd)
        att = (q @ k.transpose(-2, -1)) * self.scale   # (B, H, T, Tk)
        # query i sits at position Tk - T + i and may attend to keys 0 .. Tk - T + i: bottom-right.
        allowed = torch.ones(T, Tk, dtype=torch.bool, device=x.device).tril(Tk - T)   # (T, Tk), True = may attend
        att = att.masked_fill(~allowed, float("-inf"))
        att = F.softmax(att, dim=-1)   # each query's row is a distribution over the keys
        y = att @ v   # (B, H, T, hd)
        return self.o_proj(y.transpose(1, 2).contiguous().view(B, T, C))   # (B, T, C)
