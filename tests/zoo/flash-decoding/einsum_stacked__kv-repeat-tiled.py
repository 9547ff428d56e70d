"""Everything stacked and contracted with einsum, the query heads unflattened to (H // G, G) where
they are (G, H // G): query head h meets KV head h % G, the KV heads dealt out in turn, instead of
h // (H // G). Each KV head is still read once for its (wrong) group."""
import math

import torch


def partial_attention(q, k_chunk, v_chunk):
    f = torch.promote_types(q.dtype, torch.float32)
    B, H, Tq, D = q.shape
    G = k_chunk.shape[1]   # KV heads: query heads g*H/G .. (g+1)*H/G - 1 share KV head g
    if H % G:
        raise ValueError(f"{H} query heads cannot share {G} KV heads evenly")
    if k_chunk.shape[-2] == 0:
        return torch.zeros(q.shape, dtype=f, device=q.device), torch.full(q.shape[:-1], -torch.inf, dtype=f, device=q.device)
    heads = q.to(f).unflatten(1, (H // G, G))   # (B, R, G, Tq, D): head r*G + g meets KV head g
    s = torch.einsum("brgqd,bgkd->brgqk", heads, k_chunk.to(f)) / math.sqrt(D)
    lse = torch.logsumexp(s, dim=-1)   # (B, R, G, Tq)
    p = torch.exp(s - lse[..., None])   # already normalised: exp(s) / Σ exp(s)
    return torch.einsum("brgqk,bgkd->brgqd", p, v_chunk.to(f)).flatten(1, 2), lse.flatten(1, 2)


def merge_partials(outs, lses):
    outs = torch.stack(tuple(outs)) if not torch.is_tensor(outs) else outs
    lses = torch.stack(tuple(lses)) if not torch.is_tensor(lses) else lses
    f = torch.promote_types(lses.dtype, torch.float32)
    w = torch.softmax(lses.to(f), dim=0)   # (n, B, H, Tq): exp(lse_j - lse)
    return torch.einsum("nbhq,nbhqd->bhqd", w, outs.to(f)), torch.logsumexp(lses.to(f), dim=0)


def split_kv_decode(q, k, v, n_splits):
    if n_splits < 1 or k.shape[-2] == 0:
        raise ValueError(f"need n_splits >= 1 and a non-empty cache, got {n_splits} and {k.shape[-2]} keys")
    size = math.ceil(k.shape[-2] / n_splits)
    parts = [partial_attention(q, kc, vc) for kc, vc in zip(k.split(size, dim=-2), v.split(size, dim=-2))]
    out, _ = merge_partials([o for o, _ in parts], [s for _, s in parts])
    return out.to(q.dtype)
