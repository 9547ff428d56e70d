"""The rope grader's expected values, written apart from the reference: RoPE as complex numbers
(RoFormer's eq. 13), attention by F.scaled_dot_product_attention, in float64.

They are answers as much as the reference is, so they stay out of student bundles with it: the
grader asks for them as ``bugs.expected``, which a bundle replays from its recordings.
"""
import torch
import torch.nn.functional as F


def rotate_complex(t, positions, base, cache_dtype=None):
    """RoPE as complex multiplication: pair (t[2i], t[2i+1]) is the complex number t[2i] + j·t[2i+1],
    times e^{j·p·θ_i}. ``cache_dtype``: the turn's cos and sin rounded to it first, as a module's
    cos/sin buffer built in that dtype holds them after the grader's ``.to(float64)``."""
    hd = t.shape[-1]
    theta = 1.0 / base ** (torch.arange(hd // 2, dtype=torch.float64) * 2 / hd)   # (hd/2,)
    turn = torch.polar(torch.ones(len(positions), hd // 2, dtype=torch.float64),
                       positions.double()[:, None] * theta)   # (T, hd/2)
    if cache_dtype is not None:
        turn = torch.complex(turn.real.to(cache_dtype).double(), turn.imag.to(cache_dtype).double())   # (T, hd/2)
    z = torch.view_as_complex(t.double().reshape(*t.shape[:-1], hd // 2, 2).contiguous())   # (..., T, hd/2)
    return torch.view_as_real(z * turn).flatten(-2)   # (..., T, hd)


def heads(sd, name, H, x):
    """x (B, T, d) through the projection ``name`` of sd, split into H heads: (B, H, T, hd), float64."""
    B, T, d = x.shape
    return (x.double() @ sd[name].double().T).view(B, T, H, d // H).transpose(1, 2)


def merged(sd, y):
    """Heads y (B, H, T, hd) side by side along the channels, through o_proj: (B, T, d), float64."""
    B, H, T, hd = y.shape
    return y.transpose(1, 2).reshape(B, T, H * hd) @ sd["o_proj.weight"].double().T


def sdpa_rope(sd, H, x, base=None, cache_dtype=None):
    """The module's output: complex rotations of q and k at positions 0..T-1, then
    F.scaled_dot_product_attention(is_causal=True); in x's dtype. ``cache_dtype`` as in rotate_complex."""
    base = 10000.0 if base is None else base
    positions = torch.arange(x.shape[1])
    q = rotate_complex(heads(sd, "q_proj.weight", H, x), positions, base, cache_dtype)   # (B, H, T, hd)
    k = rotate_complex(heads(sd, "k_proj.weight", H, x), positions, base, cache_dtype)   # (B, H, T, hd)
    y = F.scaled_dot_product_attention(q, k, heads(sd, "v_proj.weight", H, x), is_causal=True)   # (B, H, T, hd)
    return merged(sd, y).to(x.dtype)   # (B, T, d)


def keys(sd, H, x, base=None, cache_dtype=None):
    """k_proj(x) split into heads and rotated at positions 0..T-1: the cached k, (B, H, T, hd) in
    x's dtype. ``cache_dtype`` as in rotate_complex."""
    base = 10000.0 if base is None else base
    k = rotate_complex(heads(sd, "k_proj.weight", H, x), torch.arange(x.shape[1]), base, cache_dtype)
    return k.to(x.dtype)   # (B, H, T, hd)


def values(sd, H, x):
    """v_proj(x) split into heads, never rotated: the cached v, (B, H, T, hd) in x's dtype."""
    return heads(sd, "v_proj.weight", H, x).to(x.dtype)


def causal_mean(sd, H, x):
    """o_proj of the mean of the values of keys 0..i at each query i: the output when every
    allowed score is 0, (B, T, d) in x's dtype."""
    v = heads(sd, "v_proj.weight", H, x)   # (B, H, T, hd)
    mean = v.cumsum(dim=2) / torch.arange(1, x.shape[1] + 1, dtype=torch.float64)[:, None]   # (B, H, T, hd)
    return merged(sd, mean).to(x.dtype)   # (B, T, d)
