"""Everything stacked and contracted with einsum, the merge written as a plain mean over the
stacked partials: "attention is linear", yet each out_j is normalised by its own chunk's sum, so
the chunks must be weighted by exp(lse_j - lse)."""
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
    rows = q.to(f).reshape(B, G, H // G * Tq, D)   # each group's query heads as the rows r of one tile
    s = torch.einsum("bgrd,bgkd->bgrk", rows, k_chunk.to(f)) / math.sqrt(D)
    lse = torch.logsumexp(s, dim=-1)   # (B, G, R)
    p = torch.exp(s - lse[..., None])   # already normalised: exp(s) / Σ exp(s)
    return torch.einsum("bgrk,bgkd->bgrd", p, v_chunk.to(f)).reshape(q.shape), lse.reshape(B, H, Tq)


def merge_partials(outs, lses):
    outs = torch.stack(tuple(outs)) if not torch.is_tensor(outs) else outs
    lses = torch.stack(tuple(lses)) if not torch.is_tensor(lses) else lses
    f = torch.promote_types(lses.dtype, torch.float32)
    return torch.einsum("nbhqd->bhqd", outs.to(f)) / outs.shape[0], torch.logsumexp(lses.to(f), dim=0)


def split_kv_decode(q, k, v, n_splits):
    if n_splits < 1 or k.shape[-2] == 0:
        raise ValueError(f"need n_splits >= 1 and a non-empty cache, got {n_splits} and {k.shape[-2]} keys")
    size = math.ceil(k.shape[-2] / n_splits)
    parts = [partial_attention(q, kc, vc) for kc, vc in zip(k.split(size, dim=-2), v.split(size, dim=-2))]
    out, _ = merge_partials([o for o, _ in parts], [s for _, s in parts])
    return out.to(q.dtype)
