"""Known RoPE bugs, each the reference with exactly that mistake."""
import torch
import torch.nn.functional as F

from reference.rope import RoPEAttention, _frequencies, apply_rope


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)   # Hugging Face / GPT-NeoX: pairs (x[i], x[i + hd/2])


def apply_rope_half_on_interleaved(x, cos, sin, positions):
    c = cos[positions].repeat_interleave(2, dim=-1)   # Llama's layout: angle i at dims 2i and 2i+1 ...
    s = sin[positions].repeat_interleave(2, dim=-1)
    return (x * c + _rotate_half(x) * s).to(x.dtype)   # ... with HF's rotate_half: no pair shares one angle


def apply_rope_half(x, cos, sin, positions):
    c = torch.cat([cos[positions]] * 2, dim=-1)   # HF's layout: angle i at dims i and i + hd/2
    s = torch.cat([sin[positions]] * 2, dim=-1)
    return (x * c + _rotate_half(x) * s).to(x.dtype)   # a right RoPE, on the other pairing


def apply_rope_positions_ignored(x, cos, sin, positions):
    return apply_rope(x, cos, sin, torch.arange(x.shape[-2], device=x.device))   # rows 0..T-1, not positions


def _cache(theta, T, dtype):
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta
    return angle.cos().to(dtype), angle.sin().to(dtype)


def _odd(head_dim):
    if head_dim % 2:
        raise ValueError(f"head_dim ({head_dim}) must be even")


def rope_cache_from_one(T, head_dim, base=10000.0, dtype=torch.float32):
    theta = _frequencies(head_dim, base)
    angle = torch.arange(1, T + 1, dtype=torch.float64)[:, None] * theta   # positions 1..T: row p is p + 1
    return angle.cos().to(dtype), angle.sin().to(dtype)


def rope_cache_i_over_hd(T, head_dim, base=10000.0, dtype=torch.float32):
    _odd(head_dim)
    theta = base ** (-torch.arange(head_dim // 2, dtype=torch.float64) / head_dim)   # i/hd: the 2 forgotten
    return _cache(theta, T, dtype)


def rope_cache_exponent_doubled(T, head_dim, base=10000.0, dtype=torch.float32):
    _odd(head_dim)
    column = torch.arange(0, head_dim, 2, dtype=torch.float64)   # already 2i ...
    return _cache(base ** (-2 * column / head_dim), T, dtype)   # ... doubled again: 4i/hd


def rope_cache_positive_exponent(T, head_dim, base=10000.0, dtype=torch.float32):
    _odd(head_dim)
    return _cache(base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim), T, dtype)   # 1 / forgotten


class _Buggy(RoPEAttention):
    """The reference's forward with one of its parts swapped for a mistake."""
    rope = staticmethod(apply_rope)
    rotate_values = False
    sdpa = False
    first = 0   # x's tokens sit at past + first .. past + first + T - 1
    softmax_dim = -1

    def forward(self, x, past_kv=None):
        B, T, C = x.shape
        past = 0 if past_kv is None else past_kv[0].shape[2]
        positions = torch.arange(past + self.first, past + self.first + T, device=x.device)
        q, k, v = (p(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = self.rope(q, self.cos, self.sin, positions), self.rope(k, self.cos, self.sin, positions)
        if self.rotate_values:
            v = self.rope(v, self.cos, self.sin, positions)   # the values rotated too
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], dim=2), torch.cat([past_kv[1], v], dim=2)
        allowed = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(past)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        else:
            att = ((q @ k.transpose(-2, -1)) * self.scale).masked_fill(~allowed, float("-inf"))
            y = F.softmax(att, dim=self.softmax_dim) @ v
        return self.o_proj(y.transpose(1, 2).contiguous().view(B, T, C)), (k, v)


class HalfOnInterleaved(_Buggy):
    rope = staticmethod(apply_rope_half_on_interleaved)


class Half(_Buggy):
    rope = staticmethod(apply_rope_half)


class RopeOnValues(_Buggy):
    rotate_values = True


class PositionsIgnored(_Buggy):
    rope = staticmethod(apply_rope_positions_ignored)


class BannedApi(_Buggy):
    sdpa = True


class SoftmaxOverQueries(_Buggy):
    softmax_dim = -2   # (B, H, T, past + T): normalised over the queries, not the keys


class PositionsFromOne(_Buggy):
    first = 1   # x's tokens at past + 1 .. past + T


class NoScaling(_Buggy):
    def __init__(self, d_model, n_heads, max_len=2048, base=10000.0):
        super().__init__(d_model, n_heads, max_len, base)
        self.scale = 1.0   # the scores q·k as they are


class DoubleScale(_Buggy):
    def __init__(self, d_model, n_heads, max_len=2048, base=10000.0):
        super().__init__(d_model, n_heads, max_len, base)
        self.scale = 1.0 / self.head_dim   # 1/sqrt(head_dim) on q, and on the scores again


class _Frequencies(RoPEAttention):
    cache = None

    def __init__(self, d_model, n_heads, max_len=2048, base=10000.0):
        super().__init__(d_model, n_heads, max_len, base)
        self.cos, self.sin = type(self).cache(max_len, self.head_dim, base, dtype=torch.float64)


class CacheFromOne(_Frequencies):
    cache = staticmethod(rope_cache_from_one)


class IOverHd(_Frequencies):
    cache = staticmethod(rope_cache_i_over_hd)


class ExponentDoubled(_Frequencies):
    cache = staticmethod(rope_cache_exponent_doubled)


class PositiveExponent(_Frequencies):
    cache = staticmethod(rope_cache_positive_exponent)


BUGS = {
    "rope-half-vs-interleaved": [{"apply_rope": apply_rope_half_on_interleaved, "RoPEAttention": HalfOnInterleaved},
                                 {"apply_rope": apply_rope_half, "RoPEAttention": Half}],
    "rope-on-values": {"RoPEAttention": RopeOnValues},
    "rope-base-exponent": [{"rope_cache": rope_cache_i_over_hd, "RoPEAttention": IOverHd},
                           {"rope_cache": rope_cache_positive_exponent, "RoPEAttention": PositiveExponent},
                           {"rope_cache": rope_cache_exponent_doubled, "RoPEAttention": ExponentDoubled}],
    "rope-positions-ignored": {"apply_rope": apply_rope_positions_ignored, "RoPEAttention": PositionsIgnored},
    "no-scaling": {"RoPEAttention": NoScaling},
    "double-scale": {"RoPEAttention": DoubleScale},
    "softmax-wrong-dim": {"RoPEAttention": SoftmaxOverQueries},
    "position-off-by-one": [{"rope_cache": rope_cache_from_one, "RoPEAttention": CacheFromOne},
                            {"RoPEAttention": PositionsFromOne}],
    "banned-api": {"RoPEAttention": BannedApi},
}
