"""Multi-head latent attention (MLA), as DeepSeek-V2 introduced it, with its compressed KV cache.

Each token's keys and values are compressed into one latent vector c_kv (kv_lora_rank numbers,
shared by every head) plus one small RoPE key k_rope (qk_rope_dim numbers, also shared by every
head): that pair is all the cache holds. The heads' keys and values are up-projected from c_kv
when needed, or never (the absorbed path: W_uk folded into the query, W_uv into the output).

Names and layouts follow DeepSeek's inference code (model.py): wq, wkv_a, wkv_b, wo. RoPE pairs
dimensions the way the rope kata does (and DeepSeek's model.py): pair i is ``(x[2i], x[2i+1])``,
turned by ``p * theta_i`` at position p, ``theta_i = 10000^(-2i/qk_rope_dim)``.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

ROPE_BASE = 10000.0


def mla_cache_bytes_per_token(kv_lora_rank: int, qk_rope_dim: int, n_layers: int = 1, dtype_bytes: int = 2) -> int:
    """Bytes the MLA cache takes per token: in every layer one latent c_kv and one RoPE key
    shared by all heads."""
    return (kv_lora_rank + qk_rope_dim) * n_layers * dtype_bytes


def kv_cache_bytes_per_token(n_kv_heads: int, head_dim: int, n_layers: int = 1, dtype_bytes: int = 2) -> int:
    """Bytes a KV cache takes per token: a key and a value of head_dim for each of n_kv_heads
    heads in every layer (multi-head attention: n_kv_heads = n_heads; GQA: fewer)."""
    return 2 * n_kv_heads * head_dim * n_layers * dtype_bytes


def apply_rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x (B, T, dim) or (B, T, H, dim), token t at position ``positions[t]`` (``positions`` (T,)):
    each pair (x[2i], x[2i+1]) turned by ``positions[t] * theta_i``. A new tensor of x's dtype."""
    dim = x.shape[-1]
    theta = ROPE_BASE ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=x.device) / dim)   # (dim/2,)
    angle = positions.to(torch.float64)[:, None] * theta   # (T, dim/2), exact in float64
    # broadcast over the axes between time and the pairs (the heads of q; none for the shared key)
    shape = (angle.shape[0],) + (1,) * (x.dim() - 3) + (dim // 2,)
    c, s = angle.cos().to(x.dtype).view(shape), angle.sin().to(x.dtype).view(shape)
    x0, x1 = x[..., 0::2], x[..., 1::2]   # (..., dim/2) each: the two halves of every pair
    return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(-2)   # (..., dim), pairs in place


class MultiHeadLatentAttention(nn.Module):
    """Causal multi-head latent attention (DeepSeek-V2). Four bias-free projections:

    - ``wq``:    d_model -> n_heads * (qk_nope_dim + qk_rope_dim), each head's query [q_nope | q_rope]
    - ``wkv_a``: d_model -> kv_lora_rank + qk_rope_dim, the down-projection [c_kv | k_rope]
    - ``wkv_b``: kv_lora_rank -> n_heads * (qk_nope_dim + v_dim), each head's [W_uk; W_uv] rows
    - ``wo``:    n_heads * v_dim -> d_model

    ``forward(x, cache, absorb)`` returns ``(out, (c_kv, k_rope))``: out (B, T, d_model) and the
    cache of every token so far, c_kv (B, t, kv_lora_rank) and k_rope (B, t, qk_rope_dim), the
    RoPE key already rotated.
    """

    def __init__(self, d_model: int, n_heads: int, kv_lora_rank: int, qk_nope_dim: int, qk_rope_dim: int,
                 v_dim: int):
        """qk_rope_dim must be even: RoPE turns pairs of dimensions."""
        super().__init__()
        self.n_heads, self.kv_lora_rank = n_heads, kv_lora_rank
        self.qk_nope_dim, self.qk_rope_dim, self.v_dim = qk_nope_dim, qk_rope_dim, v_dim
        # a score sums the nope and the rope products: qk_nope_dim + qk_rope_dim of them.
        self.scale = 1.0 / math.sqrt(qk_nope_dim + qk_rope_dim)
        self.wq = nn.Linear(d_model, n_heads * (qk_nope_dim + qk_rope_dim), bias=False)
        self.wkv_a = nn.Linear(d_model, kv_lora_rank + qk_rope_dim, bias=False)
        self.wkv_b = nn.Linear(kv_lora_rank, n_heads * (qk_nope_dim + v_dim), bias=False)
        self.wo = nn.Linear(n_heads * v_dim, d_model, bias=False)

    def forward(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None = None,
                absorb: bool = False) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x (B, T, d_model), its tokens at positions past .. past + T - 1 where past is the length of
        ``cache`` (0 without one) -> (out (B, T, d_model), (c_kv, k_rope)), c_kv (B, past + T,
        kv_lora_rank) and k_rope (B, past + T, qk_rope_dim). Causal: query i sees keys 0 .. past + i.

        absorb=False up-projects the cached latents into every head's keys and values; absorb=True
        computes the same attention in the latent space, never up-projecting the cache."""
        B, T, _ = x.shape
        H, nope, rope, r = self.n_heads, self.qk_nope_dim, self.qk_rope_dim, self.kv_lora_rank
        past = 0 if cache is None else cache[0].shape[1]
        positions = torch.arange(past, past + T, device=x.device)   # (T,): where x's tokens sit
        q = self.wq(x).view(B, T, H, nope + rope)   # (B, T, H, nope + rope)
        q_nope, q_rope = q.split([nope, rope], dim=-1)   # (B, T, H, nope), (B, T, H, rope)
        q_rope = apply_rope(q_rope, positions)   # (B, T, H, rope)
        c_kv, k_rope = self.wkv_a(x).split([r, rope], dim=-1)   # (B, T, r), (B, T, rope)
        # RoPE only on the decoupled key, never on c_kv: W_uk must not depend on the position, or it
        # could not be folded into the query. One rotated key for all heads: rope numbers per token.
        k_rope = apply_rope(k_rope, positions)   # (B, T, rope)
        if cache is not None:
            c_kv = torch.cat([cache[0], c_kv], dim=1)   # (B, Tk, r), Tk = past + T
            k_rope = torch.cat([cache[1], k_rope], dim=1)   # (B, Tk, rope)
        Tk = c_kv.shape[1]
        w = self.wkv_b.weight.view(H, nope + self.v_dim, r)   # (H, nope + v, r): rows of head h
        w_uk, w_uv = w[:, :nope], w[:, nope:]   # (H, nope, r), (H, v, r)
        # the decoupled part: every head's q_rope against the one shared rotated key
        scores = torch.einsum("bthd,bsd->bhts", q_rope, k_rope)   # (B, H, T, Tk)
        if absorb:
            # q_nope·(W_uk c) = (q_nope W_uk)·c: the query goes into the latent space, the cache stays there.
            q_lat = torch.einsum("bthd,hdc->bthc", q_nope, w_uk)   # (B, T, H, r)
            scores = scores + torch.einsum("bthc,bsc->bhts", q_lat, c_kv)   # (B, H, T, Tk)
        else:
            kv = F.linear(c_kv, self.wkv_b.weight).view(B, Tk, H, nope + self.v_dim)   # (B, Tk, H, nope + v)
            k_nope, v = kv.split([nope, self.v_dim], dim=-1)   # (B, Tk, H, nope), (B, Tk, H, v)
            scores = scores + torch.einsum("bthd,bshd->bhts", q_nope, k_nope)   # (B, H, T, Tk)
        scores = scores * self.scale
        # query i sits at past + i = Tk - T + i and sees keys 0 .. Tk - T + i: bottom-right aligned.
        allowed = torch.ones(T, Tk, dtype=torch.bool, device=x.device).tril(Tk - T)   # (T, Tk), True = may attend
        att = F.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)   # (B, H, T, Tk)
        if absorb:
            o_lat = torch.einsum("bhts,bsc->bthc", att, c_kv)   # (B, T, H, r): the weighted latents
            o = torch.einsum("bthc,hdc->bthd", o_lat, w_uv)   # (B, T, H, v): W_uv applied once per query
        else:
            o = torch.einsum("bhts,bshd->bthd", att, v)   # (B, T, H, v)
        return self.wo(o.reshape(B, T, H * self.v_dim)), (c_kv, k_rope)   # (B, T, d), cache
