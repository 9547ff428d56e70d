"""Known Flash-Decoding bugs, each the reference with exactly that mistake.

Each public function below is one bug (or one way of writing it), named in BUGS by its diagnosis
code. An oracle is the reference with some names replaced, and the reference's split_kv_decode
calls the reference's own partial_attention and merge_partials: so a buggy partial or merge comes
with ``split_<...>``, the reference's split_kv_decode over it (``_splitting``), as a learner's
file whose split_kv_decode calls its own buggy function would behave.
"""
import math

import torch
import torch.nn.functional as F

from reference.flash_decoding import merge_partials, partial_attention


def _split(q, k, v, n_splits, partial=partial_attention, merge=merge_partials):
    Tk = k.size(-2)
    if n_splits < 1:
        raise ValueError(f"n_splits ({n_splits}) must be at least 1")
    if Tk == 0:
        raise ValueError("the KV cache is empty")
    chunk = math.ceil(Tk / n_splits)
    outs, lses = [], []
    for i in range(n_splits):
        s0, s1 = min(i * chunk, Tk), min((i + 1) * chunk, Tk)
        out_i, lse_i = partial(q, k[:, :, s0:s1], v[:, :, s0:s1])
        outs.append(out_i)
        lses.append(lse_i)
    out, _ = merge(outs, lses)
    return out.to(q.dtype)


def _splitting(name, partial=partial_attention, merge=merge_partials):
    """The reference's split_kv_decode over this partial and merge, named for the shim's import."""
    def split(q, k, v, n_splits):
        return _split(q, k, v, n_splits, partial=partial, merge=merge)
    split.__name__ = split.__qualname__ = name
    return split


def _grouped(attend):
    """A partial_attention that checks, packs and unpacks as the reference does and runs
    ``attend(q_rows, k_chunk, v_chunk)`` on a KV group's query rows, (B, H_kv, n_rep*Tq, head_dim),
    in the partials' dtype: the reference with its chunk's attention replaced by ``attend``."""
    def partial(q, k_chunk, v_chunk):
        B, H, Tq, hd = q.shape
        Hkv = k_chunk.size(1)
        if H % Hkv != 0:
            raise ValueError(f"q's {H} heads are not a whole number of groups of k's {Hkv} KV heads")
        dtype = torch.promote_types(q.dtype, torch.float32)
        if k_chunk.size(-2) == 0:
            return q.new_zeros(B, H, Tq, hd, dtype=dtype), q.new_full((B, H, Tq), float("-inf"), dtype=dtype)
        rows = q.to(dtype).reshape(B, Hkv, H // Hkv * Tq, hd)   # (B, Hkv, n_rep*Tq, hd)
        out, lse = attend(rows, k_chunk.to(dtype), v_chunk.to(dtype))
        return out.reshape(B, H, Tq, hd), lse.reshape(B, H, Tq)
    partial.__name__ = partial.__qualname__ = attend.__name__
    return partial


def _stacked(outs, lses):
    outs, lses = torch.stack(list(outs)), torch.stack(list(lses))
    dtype = torch.promote_types(torch.promote_types(outs.dtype, lses.dtype), torch.float32)
    return outs.to(dtype), lses.to(dtype)


# --- partials-averaged: the chunks' outputs combined without their weights exp(lse_j - lse) ---

def merge_by_mean(outs, lses):
    outs, lses = _stacked(outs, lses)
    return outs.mean(dim=0), torch.logsumexp(lses, dim=0)   # every chunk weighted 1/n


def merge_by_mean_of_nonempty(outs, lses):
    outs, lses = _stacked(outs, lses)
    full = torch.isfinite(lses)[..., None]   # (n, B, H, Tq, 1) the chunks that hold keys
    return (outs * full).sum(dim=0) / full.sum(dim=0), torch.logsumexp(lses, dim=0)


def merge_by_sum(outs, lses):
    outs, lses = _stacked(outs, lses)
    return outs.sum(dim=0), torch.logsumexp(lses, dim=0)   # "attention is linear in v": the outs added up


# --- merge-without-max: exp(lse_j) (or exp(score)) summed without subtracting the max first ---

def merge_exp_without_max(outs, lses):
    outs, lses = _stacked(outs, lses)
    w = torch.exp(lses)   # (n, B, H, Tq): inf once lse_j > 709 (float64) or 88 (float32)
    l = w.sum(dim=0)
    return (w[..., None] * outs).sum(dim=0) / l[..., None], torch.log(l)


def merge_lse_without_max(outs, lses):
    outs, lses = _stacked(outs, lses)
    w = torch.softmax(lses, dim=0)   # the weights are right: softmax subtracts the max
    return (w[..., None] * outs).sum(dim=0), torch.log(torch.exp(lses).sum(dim=0))   # lse overflows


@_grouped
def partial_exp_without_max(q, k_chunk, v_chunk):
    e = torch.exp((q @ k_chunk.transpose(-2, -1)) / math.sqrt(q.size(-1)))   # exp(score): inf for a score > 709
    l = e.sum(dim=-1)
    return (e @ v_chunk) / l[..., None], torch.log(l)


# --- empty-split-lse-zero: an empty chunk's lse taken as 0 (weight exp(0) = 1) instead of -inf ---

def partial_empty_lse_zero(q, k_chunk, v_chunk):
    out, lse = partial_attention(q, k_chunk, v_chunk)
    if k_chunk.size(-2) == 0:
        lse = torch.zeros_like(lse)   # "log of nothing" written as 0: the empty chunk weighs like a score of 0
    return out, lse


def merge_empty_lse_as_zero(outs, lses):
    outs, lses = _stacked(outs, lses)
    return merge_partials(outs, torch.nan_to_num(lses, neginf=0.0))   # -inf "cleaned" to 0


def split_lses_preallocated_zero(q, k, v, n_splits):
    B, H, Tq, hd = q.shape
    Tk = k.size(-2)
    if n_splits < 1:
        raise ValueError(f"n_splits ({n_splits}) must be at least 1")
    if Tk == 0:
        raise ValueError("the KV cache is empty")
    dtype = torch.promote_types(q.dtype, torch.float32)
    chunk = math.ceil(Tk / n_splits)
    outs = q.new_zeros(n_splits, B, H, Tq, hd, dtype=dtype)
    lses = q.new_zeros(n_splits, B, H, Tq, dtype=dtype)   # should start at -inf: the empty splits keep 0
    for i in range(n_splits):
        s0, s1 = i * chunk, min((i + 1) * chunk, Tk)
        if s0 >= s1:
            continue
        outs[i], lses[i] = partial_attention(q, k[:, :, s0:s1], v[:, :, s0:s1])
    out, _ = merge_partials(outs, lses)
    return out.to(q.dtype)


# --- merge-in-float16: the partials or the merge kept in half precision ---

def merge_cast_to_float16(outs, lses):
    outs, lses = _stacked(outs, lses)
    out, lse = merge_partials(outs.half(), lses.half())   # stored in float16: an lse_j near 100 keeps ~0.06
    return out.to(outs.dtype), lse.to(lses.dtype)


def merge_weights_in_float16(outs, lses):
    outs, lses = _stacked(outs, lses)
    m = lses.amax(dim=0)
    w = torch.exp((lses - m).half())   # the weights rounded to float16
    l = w.sum(dim=0)
    out = ((w[..., None] * outs.half()).sum(dim=0) / l[..., None]).to(outs.dtype)
    return out, m + torch.log(l.to(lses.dtype))


def merge_in_bfloat16(outs, lses):
    outs, lses = _stacked(outs, lses)
    out, lse = merge_partials(outs.bfloat16(), lses.bfloat16())   # stored in bfloat16: 8 significant bits
    return out.to(outs.dtype), lse.to(lses.dtype)


def partial_in_input_dtype(q, k_chunk, v_chunk):
    out, lse = partial_attention(q, k_chunk, v_chunk)
    return out.to(q.dtype), lse.to(q.dtype)   # float16 inputs: float16 partials, merged in float16


def split_partials_cast_to_input_dtype(q, k, v, n_splits):
    def partial(q_, k_, v_):
        out, lse = partial_attention(q_, k_, v_)
        return out.to(q_.dtype), lse.to(q_.dtype)   # stored in the activations' dtype before the merge
    return _split(q, k, v, n_splits, partial=partial)


# --- no-scaling and double-scale: a chunk's scores scaled by 1 or by 1/head_dim, not 1/sqrt(head_dim) ---

def _scaled(scale):
    """The reference's chunk attention with ``scale(head_dim)`` where it has 1/sqrt(head_dim)."""
    def attend(q, k_chunk, v_chunk):
        s = (q @ k_chunk.transpose(-2, -1)) * scale(q.size(-1))
        m = s.amax(dim=-1)
        p = torch.exp(s - m[..., None])
        l = p.sum(dim=-1)
        return (p @ v_chunk) / l[..., None], m + torch.log(l)
    return attend


@_grouped
def partial_unscaled(q, k_chunk, v_chunk):
    return _scaled(lambda hd: 1.0)(q, k_chunk, v_chunk)   # q·k as it is


@_grouped
def partial_scaled_twice(q, k_chunk, v_chunk):
    return _scaled(lambda hd: 1.0 / hd)(q, k_chunk, v_chunk)   # q and k each by 1/sqrt(head_dim)


# --- softmax-wrong-dim: a chunk's max and sum taken over the queries instead of its keys ---

@_grouped
def partial_softmax_over_queries(q, k_chunk, v_chunk):
    s = (q @ k_chunk.transpose(-2, -1)) / math.sqrt(q.size(-1))   # (B, Hkv, n_rep*Tq, Tc)
    m = s.amax(dim=-2, keepdim=True)   # (B, Hkv, 1, Tc): each key's largest score over the group's query rows
    p = torch.exp(s - m)
    # each key's weights sum to 1 over the query rows: one decoding query of one head gives every key
    # the weight 1; the lse is taken over the keys, as its (B, H, Tq) shape asks
    return (p / p.sum(dim=-2, keepdim=True)) @ v_chunk, torch.logsumexp(s, dim=-1)


# --- banned-api: a library attention on a chunk ---

def partial_with_sdpa(q, k_chunk, v_chunk):
    out, lse = partial_attention(q, k_chunk, v_chunk)   # lse by hand, the output from SDPA
    if k_chunk.size(-2) == 0:
        return out, lse
    return F.scaled_dot_product_attention(q.to(lse.dtype), k_chunk.to(lse.dtype), v_chunk.to(lse.dtype),
                                          enable_gqa=True), lse


# --- kv-repeat-tiled: query head h paired with KV head h % H_kv, not h // n_rep ---

def partial_groups_tiled(q, k_chunk, v_chunk):
    B, H, Tq, hd = q.shape
    Hkv = k_chunk.size(1)
    if H % Hkv != 0:
        raise ValueError(f"q's {H} heads are not a whole number of groups of k's {Hkv} KV heads")
    n_rep = H // Hkv
    # heads viewed as (n_rep, Hkv) where they are (Hkv, n_rep): group g gathers heads g, g + Hkv, g + 2·Hkv, ...
    q_tiled = q.reshape(B, n_rep, Hkv, Tq, hd).transpose(1, 2).reshape(B, H, Tq, hd)
    out, lse = partial_attention(q_tiled, k_chunk, v_chunk)   # the reference's packing of these rows
    untile = lambda t: t.reshape(B, Hkv, n_rep, *t.shape[2:]).transpose(1, 2).reshape(t.shape)   # noqa: E731
    return untile(out), untile(lse)


def partial_heads_dealt(q, k_chunk, v_chunk):
    H, Hkv = q.size(1), k_chunk.size(1)
    if H % Hkv != 0:
        raise ValueError(f"q's {H} heads are not a whole number of groups of k's {Hkv} KV heads")
    order = torch.arange(H, device=q.device).reshape(H // Hkv, Hkv).T.flatten()   # (H,) heads dealt out in turn
    out, lse = partial_attention(q[:, order], k_chunk, v_chunk)   # row j of the packing is head order[j]
    back = torch.argsort(order)   # (H,)
    return out[:, back], lse[:, back]


# --- kv-read-per-query-head: the cache read once per query head, not once per KV group ---

def partial_kv_repeated(q, k_chunk, v_chunk):
    B, Hkv, Tc, hd = k_chunk.shape
    if q.size(1) % Hkv != 0:
        raise ValueError(f"q's {q.size(1)} heads are not a whole number of groups of k's {Hkv} KV heads")
    n_rep = q.size(1) // Hkv   # Hugging Face's repeat_kv: a copy of each KV head per query head
    repeat = lambda t: t[:, :, None].expand(B, Hkv, n_rep, Tc, hd).reshape(B, Hkv * n_rep, Tc, hd)   # noqa: E731
    return partial_attention(q, repeat(k_chunk), repeat(v_chunk))   # (B, H, Tc, hd): n_rep times the reads


def split_cache_repeated(q, k, v, n_splits):
    H, Hkv = q.size(1), k.size(1)
    if H % Hkv != 0:
        raise ValueError(f"q's {H} heads are not a whole number of groups of k's {Hkv} KV heads")
    k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)   # (B, H, Tk, hd) copies
    return _split(q, k, v, n_splits)


def partial_per_query_head(q, k_chunk, v_chunk):
    H, Hkv = q.size(1), k_chunk.size(1)
    if H % Hkv != 0:
        raise ValueError(f"q's {H} heads are not a whole number of groups of k's {Hkv} KV heads")
    kv = [slice(h // (H // Hkv), h // (H // Hkv) + 1) for h in range(H)]   # the right KV head for each query head
    # ... read again for every query head of its group
    heads = [partial_attention(q[:, h:h + 1], k_chunk[:, kv[h]], v_chunk[:, kv[h]]) for h in range(H)]
    return torch.cat([o for o, _ in heads], dim=1), torch.cat([lse for _, lse in heads], dim=1)


split_by_mean = _splitting("split_by_mean", merge=merge_by_mean)
split_by_mean_of_nonempty = _splitting("split_by_mean_of_nonempty", merge=merge_by_mean_of_nonempty)
split_by_sum = _splitting("split_by_sum", merge=merge_by_sum)
split_merging_exp_without_max = _splitting("split_merging_exp_without_max", merge=merge_exp_without_max)
split_merging_lse_without_max = _splitting("split_merging_lse_without_max", merge=merge_lse_without_max)
split_partials_exp_without_max = _splitting("split_partials_exp_without_max", partial=partial_exp_without_max)
split_partials_empty_lse_zero = _splitting("split_partials_empty_lse_zero", partial=partial_empty_lse_zero)
split_merging_empty_lse_as_zero = _splitting("split_merging_empty_lse_as_zero", merge=merge_empty_lse_as_zero)
split_merging_cast_to_float16 = _splitting("split_merging_cast_to_float16", merge=merge_cast_to_float16)
split_merging_weights_in_float16 = _splitting("split_merging_weights_in_float16", merge=merge_weights_in_float16)
split_merging_in_bfloat16 = _splitting("split_merging_in_bfloat16", merge=merge_in_bfloat16)
split_partials_in_input_dtype = _splitting("split_partials_in_input_dtype", partial=partial_in_input_dtype)
split_partials_unscaled = _splitting("split_partials_unscaled", partial=partial_unscaled)
split_partials_scaled_twice = _splitting("split_partials_scaled_twice", partial=partial_scaled_twice)
split_partials_softmax_over_queries = _splitting("split_partials_softmax_over_queries",
                                                 partial=partial_softmax_over_queries)
split_partials_with_sdpa = _splitting("split_partials_with_sdpa", partial=partial_with_sdpa)
split_partials_groups_tiled = _splitting("split_partials_groups_tiled", partial=partial_groups_tiled)
split_partials_heads_dealt = _splitting("split_partials_heads_dealt", partial=partial_heads_dealt)
split_partials_kv_repeated = _splitting("split_partials_kv_repeated", partial=partial_kv_repeated)
split_partials_per_query_head = _splitting("split_partials_per_query_head", partial=partial_per_query_head)


def _v(**overrides):
    """One variant: the buggy functions, and the reference's split_kv_decode over them."""
    split = overrides.pop("split", None)
    return {**overrides, **({"split_kv_decode": split} if split else {})}


BUGS = {
    "partials-averaged": [_v(merge_partials=merge_by_mean, split=split_by_mean),
                          _v(merge_partials=merge_by_mean_of_nonempty, split=split_by_mean_of_nonempty),
                          _v(merge_partials=merge_by_sum, split=split_by_sum)],
    "merge-without-max": [_v(merge_partials=merge_exp_without_max, split=split_merging_exp_without_max),
                          _v(merge_partials=merge_lse_without_max, split=split_merging_lse_without_max),
                          _v(partial_attention=partial_exp_without_max, split=split_partials_exp_without_max)],
    "empty-split-lse-zero": [_v(partial_attention=partial_empty_lse_zero, split=split_partials_empty_lse_zero),
                             _v(merge_partials=merge_empty_lse_as_zero, split=split_merging_empty_lse_as_zero),
                             _v(split=split_lses_preallocated_zero)],
    "merge-in-float16": [_v(merge_partials=merge_cast_to_float16, split=split_merging_cast_to_float16),
                         _v(merge_partials=merge_weights_in_float16, split=split_merging_weights_in_float16),
                         _v(merge_partials=merge_in_bfloat16, split=split_merging_in_bfloat16),
                         _v(partial_attention=partial_in_input_dtype, split=split_partials_in_input_dtype),
                         _v(split=split_partials_cast_to_input_dtype)],
    "no-scaling": _v(partial_attention=partial_unscaled, split=split_partials_unscaled),
    "double-scale": _v(partial_attention=partial_scaled_twice, split=split_partials_scaled_twice),
    "softmax-wrong-dim": _v(partial_attention=partial_softmax_over_queries, split=split_partials_softmax_over_queries),
    "banned-api": _v(partial_attention=partial_with_sdpa, split=split_partials_with_sdpa),
    "kv-repeat-tiled": [_v(partial_attention=partial_groups_tiled, split=split_partials_groups_tiled),
                        _v(partial_attention=partial_heads_dealt, split=split_partials_heads_dealt)],
    "kv-read-per-query-head": [_v(partial_attention=partial_kv_repeated, split=split_partials_kv_repeated),
                               _v(split=split_cache_repeated),
                               _v(partial_attention=partial_per_query_head, split=split_partials_per_query_head)],
}
