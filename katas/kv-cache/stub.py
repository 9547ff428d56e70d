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
        raise NotImplementedError("write KVCache.__init__")

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the keys and values of t_new tokens, (B, n_kv_heads, t_new, head_dim) each; return
        all of them, (B, n_kv_heads, t_old + t_new, head_dim) each, the new tokens last."""
        raise NotImplementedError("write KVCache.append")

    def reset(self) -> None:
        """Forget every token: the next append starts a new sequence."""
        raise NotImplementedError("write KVCache.reset")

    def __len__(self) -> int:
        """The number of tokens cached."""
        raise NotImplementedError("write KVCache.__len__")


class GroupedQueryAttention(nn.Module):
    """Causal grouped-query attention (the gqa kata's module) that decodes with a KVCache: groups
    of ``n_heads // n_kv_heads`` query heads share one key/value head, and only the
    ``n_kv_heads`` heads of keys and values are cached.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int):
        """Raises ValueError unless ``n_heads`` divides ``d_model`` and ``n_kv_heads`` divides ``n_heads``."""
        super().__init__()
        # head_dim = d_model // n_heads; all four projections with bias=False:
        # self.q_proj = nn.Linear(d_model, d_model)
        # self.k_proj = nn.Linear(d_model, n_kv_heads * head_dim)
        # self.v_proj = nn.Linear(d_model, n_kv_heads * head_dim)
        # self.o_proj = nn.Linear(d_model, d_model)
        raise NotImplementedError("write GroupedQueryAttention.__init__")

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, start_pos: int = 0) -> torch.Tensor:
        """x (B, T, d_model), the tokens at positions start_pos .. start_pos + T - 1 -> (B, T, d_model).

        Without a cache, x is the whole sequence and attention is causal. With one, the new keys
        and values (n_kv_heads heads, before any repeat) are appended to it, and the T queries
        attend to every cached key, query i sitting at position start_pos + i: the causal mask is
        aligned bottom-right. Raises ValueError, before touching the cache, unless start_pos equals
        len(cache) (0 without a cache).
        """
        raise NotImplementedError("write GroupedQueryAttention.forward")
