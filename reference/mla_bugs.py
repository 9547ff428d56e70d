"""Known multi-head latent attention bugs, each the reference with exactly that mistake (variants:
the same mistake as different people write it)."""
import torch
import torch.nn.functional as F

from reference.mla import MultiHeadLatentAttention, apply_rope


def attend(m, q_nope, q_rope, c_kv, k_rope, absorb, *, w_uk=None, w_uv_t=None, top_left=False, scale=None,
           softmax_dim=-1):
    """The reference's attention over a latent cache, (B, T, d_model): naive (keys and values
    up-projected from c_kv) or absorbed, with the per-head factors ``w_uk`` (H, nope, r) and
    ``w_uv_t`` (H, r, v) the absorbed path uses (the right ones unless a bug gives its own), the
    causal mask aligned bottom-right (top-left where a bug says ``top_left``), the scores
    multiplied by the module's scale (by ``scale`` where a bug gives its own), and the softmax over
    the keys, the last axis of (B, H, T, Tk) (over ``softmax_dim`` where a bug gives its own)."""
    B, T, H, _ = q_nope.shape
    nope, vd, r, Tk = m.qk_nope_dim, m.v_dim, m.kv_lora_rank, c_kv.shape[1]
    w = m.wkv_b.weight.view(H, nope + vd, r)
    w_uk = w[:, :nope] if w_uk is None else w_uk
    w_uv_t = w[:, nope:].transpose(1, 2) if w_uv_t is None else w_uv_t
    scores = torch.einsum("bthd,bsd->bhts", q_rope, k_rope)
    if absorb:
        scores = scores + torch.einsum("bthc,bsc->bhts", torch.einsum("bthd,hdc->bthc", q_nope, w_uk), c_kv)
    else:
        kv = F.linear(c_kv, m.wkv_b.weight).view(B, Tk, H, nope + vd)
        scores = scores + torch.einsum("bthd,bshd->bhts", q_nope, kv[..., :nope])
    allowed = torch.ones(T, Tk, dtype=torch.bool, device=c_kv.device).tril(0 if top_left else Tk - T)
    scale = m.scale if scale is None else scale
    att = F.softmax((scores * scale).masked_fill(~allowed, float("-inf")), dim=softmax_dim)
    if absorb:
        o = torch.einsum("bthc,hcd->bthd", torch.einsum("bhts,bsc->bthc", att, c_kv), w_uv_t)
    else:
        o = torch.einsum("bhts,bshd->bthd", att, kv[..., nope:])
    return m.wo(o.reshape(B, T, H * vd))


def queries(m, x, positions, rope=apply_rope):
    """q_nope (B, T, H, nope) and the rotated q_rope (B, T, H, rope), as the reference makes them
    (``rope`` the rotation, the reference's unless a bug gives its own)."""
    B, T, _ = x.shape
    q = m.wq(x).view(B, T, m.n_heads, m.qk_nope_dim + m.qk_rope_dim)
    return q[..., :m.qk_nope_dim], rope(q[..., m.qk_nope_dim:], positions)


def latent_forward(m, x, cache, absorb, down, rope=apply_rope, first=None, **options):
    """The reference's forward with ``down(m, x, positions) -> (c_kv, k_rope)`` making what is
    cached, ``rope`` rotating the queries, the new tokens at positions from the cache's length on
    (from ``first`` where a bug gives its own), and ``options`` for ``attend``."""
    B, T, _ = x.shape
    past = 0 if cache is None else cache[0].shape[1]
    first = past if first is None else first
    positions = torch.arange(first, first + T, device=x.device)
    q_nope, q_rope = queries(m, x, positions, rope)
    c_kv, k_rope = down(m, x, positions)
    if cache is not None:
        c_kv, k_rope = torch.cat([cache[0], c_kv], dim=1), torch.cat([cache[1], k_rope], dim=1)
    return attend(m, q_nope, q_rope, c_kv, k_rope, absorb, **options), (c_kv, k_rope)


def right_down(m, x, positions):
    c_kv, k_rope = m.wkv_a(x).split([m.kv_lora_rank, m.qk_rope_dim], dim=-1)
    return c_kv, apply_rope(k_rope, positions)


# --- rope-on-latent ---------------------------------------------------------------------------

class RotatesLatent(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorb=False):
        def down(m, x, positions):
            c_kv, k_rope = right_down(m, x, positions)
            # the compressed part turned too, at the token's position: W_uk c_kv then depends on where
            # the key sits, so it can no longer be folded into a query that does not know that.
            return apply_rope(c_kv, positions), k_rope
        return latent_forward(self, x, cache, absorb, down)


class RotatesBeforeSplit(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorb=False):
        def down(m, x, positions):
            # RoPE on wkv_a's whole output, [c_kv | k_rope] as one vector of r + rope dims, then split
            return apply_rope(m.wkv_a(x), positions).split([m.kv_lora_rank, m.qk_rope_dim], dim=-1)
        return latent_forward(self, x, cache, absorb, down)


# --- rope-half-vs-interleaved ------------------------------------------------------------------

def rope_on_halves(x, positions):
    """Hugging Face's rotate_half pairing: dimension i turned with dimension i + dim/2 (by the same
    angle p·θ_i), where the kata pairs x[2i] with x[2i+1]."""
    dim = x.shape[-1]
    interleaved = x.unflatten(-1, (2, dim // 2)).transpose(-1, -2).flatten(-2)   # (x0, x_{d/2}, x1, ...)
    return apply_rope(interleaved, positions).unflatten(-1, (dim // 2, 2)).transpose(-1, -2).flatten(-2)


class RotatesHalves(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorb=False):
        def down(m, x, positions):
            c_kv, k_rope = m.wkv_a(x).split([m.kv_lora_rank, m.qk_rope_dim], dim=-1)
            return c_kv, rope_on_halves(k_rope, positions)
        return latent_forward(self, x, cache, absorb, down, rope=rope_on_halves)


# --- per-head-rope-key-cached -----------------------------------------------------------------

class CachesExpandedRopeKey(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorb=False):
        B, T, _ = x.shape
        H = self.n_heads
        past = 0 if cache is None else cache[0].shape[1]
        positions = torch.arange(past, past + T, device=x.device)
        q_nope, q_rope = queries(self, x, positions)
        c_kv, k_rope = right_down(self, x, positions)
        # the shared key copied to every head before caching (Hugging Face's k_pe.expand): H times
        # the rope numbers per token, for the same values
        k_rope = k_rope[:, :, None].expand(B, T, H, self.qk_rope_dim)   # (B, T, H, rope)
        if cache is not None:
            c_kv, k_rope = torch.cat([cache[0], c_kv], dim=1), torch.cat([cache[1], k_rope], dim=1)
        return attend(self, q_nope, q_rope, c_kv, k_rope[:, :, 0], absorb), (c_kv, k_rope)


class CachesRopeKeyPerHeadFirst(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorb=False):
        B, T, _ = x.shape
        H = self.n_heads
        past = 0 if cache is None else cache[0].shape[1]
        positions = torch.arange(past, past + T, device=x.device)
        q_nope, q_rope = queries(self, x, positions)
        c_kv, k_rope = right_down(self, x, positions)
        # one rope key per head, heads first as in a (B, H, T, dim) KV cache
        k_rope = k_rope[:, None].repeat(1, H, 1, 1)   # (B, H, T, rope)
        if cache is not None:
            c_kv, k_rope = torch.cat([cache[0], c_kv], dim=1), torch.cat([cache[1], k_rope], dim=2)
        return attend(self, q_nope, q_rope, c_kv, k_rope[:, 0], absorb), (c_kv, k_rope)


# --- cache-holds-up-projected-keys ------------------------------------------------------------

def up_projected(m, x, cache):
    """Hugging Face's DeepSeek-V2 code: every head's full key [k_nope | k_rope] and value, (B, H,
    t, nope + rope) and (B, H, t, v), built from the new tokens' c_kv and cached (the cache of a
    plain multi-head attention); the attention reads them."""
    B, T, _ = x.shape
    H, nope, rope, vd = m.n_heads, m.qk_nope_dim, m.qk_rope_dim, m.v_dim
    past = 0 if cache is None else cache[0].shape[2]
    positions = torch.arange(past, past + T, device=x.device)
    q_nope, q_rope = queries(m, x, positions)
    c_kv, k_rope = right_down(m, x, positions)
    kv = m.wkv_b(c_kv).view(B, T, H, nope + vd)
    k = torch.cat([kv[..., :nope], k_rope[:, :, None].expand(B, T, H, rope)], dim=-1).transpose(1, 2)
    v = kv[..., nope:].transpose(1, 2)
    if cache is not None:
        k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
    q = torch.cat([q_nope, q_rope], dim=-1).transpose(1, 2)
    Tk = k.shape[2]
    allowed = torch.ones(T, Tk, dtype=torch.bool, device=x.device).tril(Tk - T)
    att = F.softmax(((q @ k.transpose(-2, -1)) * m.scale).masked_fill(~allowed, float("-inf")), dim=-1)
    return m.wo((att @ v).transpose(1, 2).reshape(B, T, H * vd)), (k, v)


class CachesUpProjectedKeys(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorb=False):
        return up_projected(self, x, cache)


class CachesWkvBOutput(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorb=False):
        # wkv_b(c_kv) cached where c_kv belongs: every head's k_nope and value, (B, t, H·(nope + v))
        B, T, _ = x.shape
        H, nope, vd = self.n_heads, self.qk_nope_dim, self.v_dim
        past = 0 if cache is None else cache[0].shape[1]
        positions = torch.arange(past, past + T, device=x.device)
        q_nope, q_rope = queries(self, x, positions)
        c_kv, k_rope = right_down(self, x, positions)
        kv = self.wkv_b(c_kv)   # (B, T, H·(nope + v))
        if cache is not None:
            kv, k_rope = torch.cat([cache[0], kv], dim=1), torch.cat([cache[1], k_rope], dim=1)
        Tk = kv.shape[1]
        k_nope, v = kv.view(B, Tk, H, nope + vd).split([nope, vd], dim=-1)
        scores = torch.einsum("bthd,bsd->bhts", q_rope, k_rope) + torch.einsum("bthd,bshd->bhts", q_nope, k_nope)
        allowed = torch.ones(T, Tk, dtype=torch.bool, device=x.device).tril(Tk - T)
        att = F.softmax((scores * self.scale).masked_fill(~allowed, float("-inf")), dim=-1)
        o = torch.einsum("bhts,bshd->bthd", att, v)
        return self.wo(o.reshape(B, T, H * vd)), (kv, k_rope)


class CachesUpProjectedNope(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorb=False):
        # the shared rope key is cached right, but beside it the up-projected k_nope of every head
        # (B, t, H, nope), where the latent c_kv belongs, and the values (B, t, H, v)
        B, T, _ = x.shape
        H, nope, vd = self.n_heads, self.qk_nope_dim, self.v_dim
        past = 0 if cache is None else cache[0].shape[1]
        positions = torch.arange(past, past + T, device=x.device)
        q_nope, q_rope = queries(self, x, positions)
        c_kv, k_rope = right_down(self, x, positions)
        kv = self.wkv_b(c_kv).view(B, T, H, nope + vd)
        k_nope, v = kv[..., :nope], kv[..., nope:]
        if cache is not None:
            k_nope = torch.cat([cache[0], k_nope], dim=1)
            k_rope = torch.cat([cache[1], k_rope], dim=1)
            v = torch.cat([cache[2], v], dim=1)
        Tk = k_nope.shape[1]
        scores = torch.einsum("bthd,bsd->bhts", q_rope, k_rope) + torch.einsum("bthd,bshd->bhts", q_nope, k_nope)
        allowed = torch.ones(T, Tk, dtype=torch.bool, device=x.device).tril(Tk - T)
        att = F.softmax((scores * self.scale).masked_fill(~allowed, float("-inf")), dim=-1)
        o = torch.einsum("bhts,bshd->bthd", att, v)
        return self.wo(o.reshape(B, T, H * vd)), (k_nope, k_rope, v)


# --- absorbed-factor-transposed ---------------------------------------------------------------

class UvReshapedNotTransposed(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorb=False):
        H, nope, vd, r = self.n_heads, self.qk_nope_dim, self.v_dim, self.kv_lora_rank
        w_uv = self.wkv_b.weight.view(H, nope + vd, r)[:, nope:]   # (H, v, r)
        # W_uvᵀ per head wanted, (H, r, v): reshape keeps the memory order, so the numbers are not
        # W_uvᵀ's, only its shape; transpose(1, 2) is the transposition.
        return latent_forward(self, x, cache, absorb, right_down, w_uv_t=w_uv.reshape(H, r, vd))


class UkReshapedNotTransposed(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorb=False):
        H, nope, vd, r = self.n_heads, self.qk_nope_dim, self.v_dim, self.kv_lora_rank
        # W_uk seen as (r, nope) per head, "k = c @ W_uk", so the query side takes its transpose:
        # but reshape(H, r, nope) of the (H, nope, r) block is no transpose.
        w_uk_seen = self.wkv_b.weight.view(H, nope + vd, r)[:, :nope].reshape(H, r, nope)   # (H, r, nope)
        return latent_forward(self, x, cache, absorb, right_down, w_uk=w_uk_seen.transpose(1, 2))


# --- absorbed-up-projects-cache ---------------------------------------------------------------

class AbsorbIgnored(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorb=False):
        # the flag is never read: the naive path, up-projecting every cached latent at each step
        return super().forward(x, cache, absorb=False)


# --- mask-top-left-aligned ---------------------------------------------------------------------

class MaskTopLeft(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorb=False):
        # tril() without the cache's offset: query i sees keys 0 .. i as if it sat at position i, so
        # a decoded token sees only key 0. Without a cache (T == Tk) both alignments agree.
        return latent_forward(self, x, cache, absorb, right_down, top_left=True)


# --- no-scaling --------------------------------------------------------------------------------

class Unscaled(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorb=False):
        # q_nope·k_nope + q_rope·k_rope into the softmax as they are, on both paths
        return latent_forward(self, x, cache, absorb, right_down, scale=1.0)


class AbsorbedUnscaled(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorb=False):
        # the absorbed path's scores, written apart from the naive path's, left unscaled: the naive
        # path is right, and absorption disagrees with it
        return latent_forward(self, x, cache, absorb, right_down, scale=1.0 if absorb else self.scale)


# --- double-scale ------------------------------------------------------------------------------

class ScaledTwice(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorb=False):
        # q multiplied by 1/sqrt(qk_nope_dim + qk_rope_dim) and the scores again: divided by
        # qk_nope_dim + qk_rope_dim, on both paths
        return latent_forward(self, x, cache, absorb, right_down, scale=self.scale ** 2)


class AbsorbedScaledTwice(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorb=False):
        # the absorbed path's queries (q_nope·W_uk and q_rope) scaled as they are made, and its scores
        # again: the naive path is right, and absorption disagrees with it
        return latent_forward(self, x, cache, absorb, right_down, scale=self.scale ** 2 if absorb else self.scale)


# --- softmax-wrong-dim -------------------------------------------------------------------------

class SoftmaxOverQueries(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorb=False):
        # each key's scores normalised over the queries (dim -2 of (B, H, T, Tk)), on both paths:
        # a decoded token's one query gives every key the weight 1
        return latent_forward(self, x, cache, absorb, right_down, softmax_dim=-2)


class AbsorbedSoftmaxOverQueries(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorb=False):
        # the absorbed path's softmax, written apart from the naive path's, over the queries: the
        # naive path is right, and absorption disagrees with it
        return latent_forward(self, x, cache, absorb, right_down, softmax_dim=-2 if absorb else -1)


# --- position-off-by-one -----------------------------------------------------------------------

class DecodesOnePositionLate(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorb=False):
        # after a cache of n tokens the new ones turned at n + 1, n + 2, ...: the first sits at n
        first = 0 if cache is None else cache[0].shape[1] + 1
        return latent_forward(self, x, cache, absorb, right_down, first=first)


class PositionsFromOne(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorb=False):
        # every token turned at its position + 1, counted from 1: each score is unchanged (queries and
        # keys move together), but the cached keys are not the ones rotated at their positions
        past = 0 if cache is None else cache[0].shape[1]
        return latent_forward(self, x, cache, absorb, right_down, first=past + 1)


# --- the cache-size functions -----------------------------------------------------------------

def latent_counted_twice(kv_lora_rank, qk_rope_dim, n_layers=1, dtype_bytes=2):
    # the K-and-V factor of a KV cache carried over: MLA caches one latent for both
    return 2 * (kv_lora_rank + qk_rope_dim) * n_layers * dtype_bytes


def latent_counted_twice_rope_once(kv_lora_rank, qk_rope_dim, n_layers=1, dtype_bytes=2):
    # c_kv counted as a key latent and a value latent, the rope key once
    return (2 * kv_lora_rank + qk_rope_dim) * n_layers * dtype_bytes


def kv_missing_factor(n_kv_heads, head_dim, n_layers=1, dtype_bytes=2):
    # keys only: the values take as many bytes again
    return n_kv_heads * head_dim * n_layers * dtype_bytes


BUGS = {
    "rope-on-latent": [{"MultiHeadLatentAttention": RotatesLatent},
                       {"MultiHeadLatentAttention": RotatesBeforeSplit}],
    "rope-half-vs-interleaved": {"MultiHeadLatentAttention": RotatesHalves},
    "per-head-rope-key-cached": [{"MultiHeadLatentAttention": CachesExpandedRopeKey},
                                 {"MultiHeadLatentAttention": CachesRopeKeyPerHeadFirst}],
    "cache-holds-up-projected-keys": [{"MultiHeadLatentAttention": CachesUpProjectedKeys},
                                      {"MultiHeadLatentAttention": CachesUpProjectedNope},
                                      {"MultiHeadLatentAttention": CachesWkvBOutput}],
    "absorbed-factor-transposed": [{"MultiHeadLatentAttention": UvReshapedNotTransposed},
                                   {"MultiHeadLatentAttention": UkReshapedNotTransposed}],
    "absorbed-up-projects-cache": {"MultiHeadLatentAttention": AbsorbIgnored},
    "mask-top-left-aligned": {"MultiHeadLatentAttention": MaskTopLeft},
    "no-scaling": [{"MultiHeadLatentAttention": Unscaled},
                   {"MultiHeadLatentAttention": AbsorbedUnscaled}],
    "double-scale": [{"MultiHeadLatentAttention": ScaledTwice},
                     {"MultiHeadLatentAttention": AbsorbedScaledTwice}],
    "softmax-wrong-dim": [{"MultiHeadLatentAttention": SoftmaxOverQueries},
                          {"MultiHeadLatentAttention": AbsorbedSoftmaxOverQueries}],
    "position-off-by-one": [{"MultiHeadLatentAttention": DecodesOnePositionLate},
                            {"MultiHeadLatentAttention": PositionsFromOne}],
    "latent-counted-twice": [{"mla_cache_bytes_per_token": latent_counted_twice},
                             {"mla_cache_bytes_per_token": latent_counted_twice_rope_once}],
    "kv-cache-missing-kv-factor": {"kv_cache_bytes_per_token": kv_missing_factor},
}
