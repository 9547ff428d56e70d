"""Known KV-cache bugs, each the reference with exactly that mistake (variants: the same mistake
as different people write it, in a torch.cat cache or in Llama's preallocated buffer)."""
import torch
import torch.nn.functional as F

from reference.kv_cache import GroupedQueryAttention, KVCache

MAX_LEN = 64   # the preallocated buffers' length: longer than any sequence the grader decodes


class Preallocated(KVCache):
    """Llama's cache, right: a buffer allocated at the first append, written at a position that
    each append moves on; the bugs below change one line of it."""

    def __init__(self):
        super().__init__()
        self.pos = 0

    def append(self, k, v):
        B, Hkv, t, hd = k.shape
        if self.k is None:
            self.k = k.new_zeros(B, Hkv, MAX_LEN, hd)
            self.v = v.new_zeros(B, Hkv, MAX_LEN, hd)
        self.k[:, :, self.pos:self.pos + t] = k
        self.v[:, :, self.pos:self.pos + t] = v
        self.pos += t
        return self.k[:, :, :self.pos], self.v[:, :, :self.pos]

    def reset(self):
        self.pos = 0   # what lies beyond pos is never read again

    def __len__(self):
        return self.pos


# --- mask-top-left-aligned --------------------------------------------------------------------

def forward_with_mask(m, x, cache, start_pos, mask, repeat=lambda t, n: t.repeat_interleave(n, dim=1), dim=-1):
    """The reference's forward with ``mask(T, Tk, device)`` (True = may attend, or None) for its causal
    mask, ``repeat(t, n_rep)`` for its grouping of the KV heads, and its softmax over ``dim``."""
    cached = 0 if cache is None else len(cache)
    if start_pos != cached:
        raise ValueError(f"start_pos is {start_pos}, but the cache holds {cached} tokens")
    B, T, C = x.shape
    q = m.q_proj(x).view(B, T, m.n_heads, m.head_dim).transpose(1, 2)
    k = m.k_proj(x).view(B, T, m.n_kv_heads, m.head_dim).transpose(1, 2)
    v = m.v_proj(x).view(B, T, m.n_kv_heads, m.head_dim).transpose(1, 2)
    if cache is not None:
        k, v = cache.append(k, v)
    Tk = k.shape[2]
    k, v = repeat(k, m.n_rep), repeat(v, m.n_rep)   # (B, H, Tk, hd)
    att = (q @ k.transpose(-2, -1)) * m.scale
    allowed = mask(T, Tk, x.device)
    if allowed is not None:
        att = att.masked_fill(~allowed, float("-inf"))
    y = F.softmax(att, dim=dim) @ v
    return m.o_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class TopLeftCausal(GroupedQueryAttention):
    def forward(self, x, cache=None, start_pos=0):
        # tril() of a (T, Tk) mask: query i may see keys 0..i, as if it sat at position i (what
        # SDPA's is_causal=True does when T != Tk). A decoded token then sees only key 0.
        return forward_with_mask(self, x, cache, start_pos,
                                 lambda T, Tk, device: torch.ones(T, Tk, dtype=torch.bool, device=device).tril())


class TopLeftCausalButOneToken(GroupedQueryAttention):
    def forward(self, x, cache=None, start_pos=0):
        # Llama's "no mask for a single token" is right; the chunk's mask is still top-left.
        return forward_with_mask(self, x, cache, start_pos, lambda T, Tk, device: None if T == 1 else
                                 torch.ones(T, Tk, dtype=torch.bool, device=device).tril())


# --- kv-repeat-tiled -------------------------------------------------------------------------

def bottom_right(T, Tk, device):
    return torch.ones(T, Tk, dtype=torch.bool, device=device).tril(Tk - T)


class RepeatTiled(GroupedQueryAttention):
    def forward(self, x, cache=None, start_pos=0):
        # `repeat` tiles the heads, [kv0, kv1, kv0, kv1, ...]: query head j reads KV head j % n_kv_heads
        return forward_with_mask(self, x, cache, start_pos, bottom_right, repeat=lambda t, n: t.repeat(1, n, 1, 1))


class ExpandTiled(GroupedQueryAttention):
    def forward(self, x, cache=None, start_pos=0):
        # Llama's repeat_kv with the new axis before the KV heads': (B, n_rep, Hkv, T, hd) merged, tiled too
        return forward_with_mask(self, x, cache, start_pos, bottom_right, repeat=lambda t, n: t[:, None].expand(
            t.shape[0], n, *t.shape[1:]).reshape(t.shape[0], n * t.shape[1], *t.shape[2:]))


# --- no-scaling, double-scale ----------------------------------------------------------------

class NoScaling(GroupedQueryAttention):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__(d_model, n_heads, n_kv_heads)
        self.scale = 1.0   # the scores q·k as they are, with and without a cache


class DoubleScale(GroupedQueryAttention):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__(d_model, n_heads, n_kv_heads)
        # q scaled by 1/sqrt(head_dim) after its projection, and the scores again: 1/head_dim in all
        self.scale = 1.0 / self.head_dim


# --- softmax-wrong-dim ------------------------------------------------------------------------

class SoftmaxOverQueries(GroupedQueryAttention):
    def forward(self, x, cache=None, start_pos=0):
        # dim=-2 of the (B, H, T, Tk) scores: each key's column sums to 1 over the new queries, and a
        # single decoded token, the only query of its call, gives every key weight 1.
        return forward_with_mask(self, x, cache, start_pos, bottom_right, dim=-2)


# --- causal-mask-off-by-one -------------------------------------------------------------------

class MaskSeesNextToken(GroupedQueryAttention):
    def forward(self, x, cache=None, start_pos=0):
        # tril(start_pos + 1): one diagonal too many, so query i (at start_pos + i) may see key
        # start_pos + i + 1, the token after it. A single decoded token has no key after it.
        return forward_with_mask(self, x, cache, start_pos, lambda T, Tk, device:
                                 torch.ones(T, Tk, dtype=torch.bool, device=device).tril(Tk - T + 1))


# --- square-chunk-mask ------------------------------------------------------------------------

class SquareChunkMask(GroupedQueryAttention):
    def forward(self, x, cache=None, start_pos=0):
        # Llama's original code: `torch.full((T, T), -inf).triu(start_pos + 1)`, no mask for a single
        # token. The (T, T) mask has no columns for the cached keys: a chunk after cached tokens
        # fails to broadcast against its (T, start_pos + T) scores.
        return forward_with_mask(self, x, cache, start_pos, lambda T, Tk, device: None if T == 1 else
                                 torch.ones(T, T, dtype=torch.bool, device=device).tril(Tk - T))


class SquareChunkMaskPadded(GroupedQueryAttention):
    def forward(self, x, cache=None, start_pos=0):
        # The same (T, T) block, with start_pos columns of zeros in front for the cached keys (the
        # later fix's hstack): its diagonal start_pos + 1 then lets query i see the chunk's tokens
        # up to i + start_pos, after it.
        return forward_with_mask(self, x, cache, start_pos, lambda T, Tk, device: None if T == 1 else torch.cat(
            [torch.ones(T, Tk - T, dtype=torch.bool, device=device),
             torch.ones(T, T, dtype=torch.bool, device=device).tril(Tk - T)], dim=1))


# --- cache-stores-repeated-kv -----------------------------------------------------------------

class StoresRepeatedKv(GroupedQueryAttention):
    def forward(self, x, cache=None, start_pos=0):
        cached = 0 if cache is None else len(cache)
        if start_pos != cached:
            raise ValueError(f"start_pos is {start_pos}, but the cache holds {cached} tokens")
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        # repeated first, cached after: n_heads heads per token, the cache as large as MHA's
        k, v = k.repeat_interleave(self.n_rep, dim=1), v.repeat_interleave(self.n_rep, dim=1)
        if cache is not None:
            k, v = cache.append(k, v)
        Tk = k.shape[2]
        att = (q @ k.transpose(-2, -1)) * self.scale
        allowed = torch.ones(T, Tk, dtype=torch.bool, device=x.device).tril(Tk - T)
        att = att.masked_fill(~allowed, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.o_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class PreallocatedByIndex(Preallocated):
    """gpt-fast's cache, right: the positions a write covers taken as an index, and the position
    moved on before the write."""

    def append(self, k, v):
        B, H, t, hd = k.shape
        if self.k is None:
            self.k = k.new_zeros(B, H, MAX_LEN, hd)
            self.v = v.new_zeros(B, H, MAX_LEN, hd)
        input_pos = torch.arange(self.pos, self.pos + t, device=k.device)   # (t,)
        self.pos += t
        self.k[:, :, input_pos] = k
        self.v[:, :, input_pos] = v
        return self.k[:, :, :self.pos], self.v[:, :, :self.pos]


# --- position-not-advanced --------------------------------------------------------------------

class PositionNotAdvanced(Preallocated):
    def append(self, k, v):
        B, Hkv, t, hd = k.shape
        if self.k is None:
            self.k = k.new_zeros(B, Hkv, MAX_LEN, hd)
            self.v = v.new_zeros(B, Hkv, MAX_LEN, hd)
        self.k[:, :, self.pos:self.pos + t] = k   # pos never moves: every append overwrites from 0
        self.v[:, :, self.pos:self.pos + t] = v
        return self.k[:, :, :self.pos + t], self.v[:, :, :self.pos + t]


class PositionNotAdvancedReadsNothing(Preallocated):
    def append(self, k, v):
        B, Hkv, t, hd = k.shape
        if self.k is None:
            self.k = k.new_zeros(B, Hkv, MAX_LEN, hd)
            self.v = v.new_zeros(B, Hkv, MAX_LEN, hd)
        self.k[:, :, self.pos:self.pos + t] = k   # written, but pos never moves: [:pos] reads nothing
        self.v[:, :, self.pos:self.pos + t] = v
        return self.k[:, :, :self.pos], self.v[:, :, :self.pos]


class LengthNotAdvanced(KVCache):
    def __init__(self):
        super().__init__()
        self.n_tokens = 0   # the count len() reports; append never adds k.shape[2] to it

    def __len__(self):
        return self.n_tokens


class PositionAdvancedByOne(Preallocated):
    def append(self, k, v):
        B, Hkv, t, hd = k.shape
        if self.k is None:
            self.k = k.new_zeros(B, Hkv, MAX_LEN, hd)
            self.v = v.new_zeros(B, Hkv, MAX_LEN, hd)
        end = self.pos + t
        self.k[:, :, self.pos:end] = k
        self.v[:, :, self.pos:end] = v
        self.pos += 1   # one token per step, as in decoding: a prefill of t tokens moves it by 1 too
        return self.k[:, :, :end], self.v[:, :, :end]


class PositionAdvancedByOneReadsToPos(Preallocated):
    def append(self, k, v):
        B, Hkv, t, hd = k.shape
        if self.k is None:
            self.k = k.new_zeros(B, Hkv, MAX_LEN, hd)
            self.v = v.new_zeros(B, Hkv, MAX_LEN, hd)
        self.k[:, :, self.pos:self.pos + t] = k
        self.v[:, :, self.pos:self.pos + t] = v
        self.pos += 1   # by 1, not by t: [:pos] then reads one token of a prefill's t
        return self.k[:, :, :self.pos], self.v[:, :, :self.pos]


class LengthAdvancedByOne(KVCache):
    def __init__(self):
        super().__init__()
        self.n_tokens = 0

    def append(self, k, v):
        self.n_tokens += 1   # one per call, as in decoding: a prefill brings k.shape[2] tokens
        return super().append(k, v)

    def reset(self):
        super().reset()
        self.n_tokens = 0

    def __len__(self):
        return self.n_tokens


# --- cache-not-reset --------------------------------------------------------------------------

class ResetForgetsSelf(KVCache):
    def reset(self):
        k = v = None   # noqa: F841  (locals: self.k and self.v keep every old token)


class ResetOnlyTheCount(KVCache):
    def __init__(self):
        super().__init__()
        self.n_tokens = 0

    def append(self, k, v):
        self.n_tokens += k.shape[2]
        return super().append(k, v)

    def reset(self):
        self.n_tokens = 0   # the count restarts, but self.k and self.v still hold the old tokens

    def __len__(self):
        return self.n_tokens


class ResetZeroesTheBuffer(Preallocated):
    def reset(self):
        if self.k is not None:   # the old values are wiped, but the write position stays where it was
            self.k.zero_()
            self.v.zero_()


# --- concat-wrong-dim -------------------------------------------------------------------------

class ConcatOnHeads(KVCache):
    def append(self, k, v):
        if self.k is None:
            self.k, self.v = k, v
        else:
            # dim=1 is time in Llama's (B, T, H, hd) layout, but the heads in this kata's (B, H, T, hd)
            self.k = torch.cat([self.k, k], dim=1)
            self.v = torch.cat([self.v, v], dim=1)
        return self.k, self.v


class ConcatOnHeadDim(KVCache):
    def append(self, k, v):
        if self.k is None:
            self.k, self.v = k, v
        else:
            self.k = torch.cat([self.k, k], dim=-1)   # the last axis is head_dim, not time
            self.v = torch.cat([self.v, v], dim=-1)
        return self.k, self.v


# --- banned-api -------------------------------------------------------------------------------

class BannedApi(GroupedQueryAttention):
    def forward(self, x, cache=None, start_pos=0):
        cached = 0 if cache is None else len(cache)
        if start_pos != cached:
            raise ValueError(f"start_pos is {start_pos}, but the cache holds {cached} tokens")
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if cache is not None:
            k, v = cache.append(k, v)
        Tk = k.shape[2]
        allowed = torch.ones(T, Tk, dtype=torch.bool, device=x.device).tril(Tk - T)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
        return self.o_proj(y.transpose(1, 2).contiguous().view(B, T, C))


BUGS = {
    "mask-top-left-aligned": [{"GroupedQueryAttention": TopLeftCausal},
                              {"GroupedQueryAttention": TopLeftCausalButOneToken}],
    "kv-repeat-tiled": [{"GroupedQueryAttention": RepeatTiled}, {"GroupedQueryAttention": ExpandTiled}],
    "cache-stores-repeated-kv": [{"GroupedQueryAttention": StoresRepeatedKv},
                                 {"GroupedQueryAttention": StoresRepeatedKv, "KVCache": PreallocatedByIndex}],
    "no-scaling": {"GroupedQueryAttention": NoScaling},
    "double-scale": {"GroupedQueryAttention": DoubleScale},
    "softmax-wrong-dim": {"GroupedQueryAttention": SoftmaxOverQueries},
    "causal-mask-off-by-one": {"GroupedQueryAttention": MaskSeesNextToken},
    "square-chunk-mask": [{"GroupedQueryAttention": SquareChunkMask},
                          {"GroupedQueryAttention": SquareChunkMaskPadded}],
    "position-not-advanced": [{"KVCache": PositionNotAdvanced}, {"KVCache": PositionNotAdvancedReadsNothing},
                              {"KVCache": LengthNotAdvanced}, {"KVCache": PositionAdvancedByOne},
                              {"KVCache": PositionAdvancedByOneReadsToPos}, {"KVCache": LengthAdvancedByOne}],
    "cache-not-reset": [{"KVCache": ResetForgetsSelf}, {"KVCache": ResetOnlyTheCount},
                        {"KVCache": ResetZeroesTheBuffer}],
    "concat-wrong-dim": [{"KVCache": ConcatOnHeads}, {"KVCache": ConcatOnHeadDim}],
    "banned-api": {"GroupedQueryAttention": BannedApi},
}
