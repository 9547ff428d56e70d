"""What multi-head latent attention must give, computed another way than the reference: each
head's full keys and values built explicitly (DeepSeek-V2's equations: k_h = [W_uk_h c_kv ;
RoPE(W_kr x)], v_h = W_uv_h c_kv), RoPE as complex multiplication (DeepSeek's freqs_cis), and
F.scaled_dot_product_attention for the attention itself, in float64."""
import torch
import torch.nn.functional as F


def rotate_complex(x: torch.Tensor, start: int = 0) -> torch.Tensor:
    """x (B, T, ..., dim), its tokens at positions start .. start + T - 1: the pairs (x[2i], x[2i+1])
    as complex numbers, multiplied by e^(i p theta_i), theta_i = 10000^(-2i/dim)."""
    T, dim = x.shape[1], x.shape[-1]
    freqs = 1.0 / 10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    p = torch.arange(start, start + T, dtype=torch.float64)
    cis = torch.polar(torch.ones(T, dim // 2, dtype=torch.float64), torch.outer(p, freqs))   # (T, dim/2)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], dim // 2, 2).contiguous())
    cis = cis.view(T, *([1] * (x.dim() - 3)), dim // 2)
    return torch.view_as_real(z * cis).flatten(-2)


def latent(sd, x, r):
    """(c_kv (B, T, r), k_rope (B, T, rope) rotated at positions 0 .. T-1): what the cache holds
    after the tokens of x, from the injected weights."""
    kv = x.double() @ sd["wkv_a.weight"].double().T   # (B, T, r + rope)
    return kv[..., :r], rotate_complex(kv[..., r:])


def keys_and_values(sd, H, dims, x):
    """Every head's full key and value, (B, H, T, nope + rope) and (B, H, T, v): what a plain
    multi-head attention would cache, and what MLA never stores."""
    r, nope, rope, vd = dims
    B, T, _ = x.shape
    c_kv, k_rope = latent(sd, x, r)
    kv = (c_kv @ sd["wkv_b.weight"].double().T).view(B, T, H, nope + vd)
    k = torch.cat([kv[..., :nope], k_rope[:, :, None].expand(B, T, H, rope)], dim=-1)
    return k.transpose(1, 2), kv[..., nope:].transpose(1, 2)


def sdpa_mla(sd, H, dims, x):
    """The causal output, (B, T, d_model), in float64: explicit keys and values through SDPA."""
    r, nope, rope, vd = dims
    B, T, _ = x.shape
    q = (x.double() @ sd["wq.weight"].double().T).view(B, T, H, nope + rope)
    q = torch.cat([q[..., :nope], rotate_complex(q[..., nope:])], dim=-1).transpose(1, 2)   # (B, H, T, nope + rope)
    k, v = keys_and_values(sd, H, dims, x)
    # SDPA's default scale is 1/sqrt(q.shape[-1]) = 1/sqrt(qk_nope_dim + qk_rope_dim)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # (B, H, T, v)
    return y.transpose(1, 2).reshape(B, T, H * vd) @ sd["wo.weight"].double().T
