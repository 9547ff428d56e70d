"""Known FlashAttention-forward bugs, each the reference with exactly that mistake.

``_tiled`` is the reference's loop with a ``mistake`` switch at the line each bug changes; each
public function below is one bug (or one way of writing it), named in BUGS by its diagnosis code.
"""
import math

import torch


# The output divided inside the key loop by the running sum so far: how much of what acc held it
# keeps when a tile is added (right: l_old * alpha / l_new), the new tile's p v divided by l_new.
IN_LOOP = ("divide-every-block", "drop-correction", "divide-tile-by-sum", "add-tile-over-sum")


def _tiled(q, k, v, block_q, block_k, causal, mistake):
    B, H, Tq, hd = q.shape
    Tk = k.size(-2)
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block_q ({block_q}) and block_k ({block_k}) must be at least 1")
    if causal and Tq > Tk:
        raise ValueError(f"causal attention needs Tq ({Tq}) <= Tk ({Tk})")
    scale = 1.0 / math.sqrt(hd)
    if mistake == "no-scaling":
        scale = 1.0
    elif mistake == "double-scale":
        scale = 1.0 / hd   # q scaled by 1/sqrt(hd), and its tiles' scores by it again
    offset = Tk - Tq
    # SDPA's is_causal: query i sits at position i, whatever Tk is, and the key blocks are skipped by that
    # position too. (Masked so but skipped bottom-right, the same values come back from more tiles, all
    # of them needed by the right mask: the count checks pass, and this oracle names the values.)
    mask_offset = 0 if mistake == "top-left" else offset
    out = torch.empty_like(q)
    lse = q.new_empty(B, H, Tq)
    ms, ls = q.new_empty(B, H, Tq), q.new_empty(B, H, Tq)
    for i0 in range(0, Tq, block_q):
        i1 = min(i0 + block_q, Tq)
        qi = q[:, :, i0:i1] * scale
        m = q.new_full((B, H, i1 - i0), float("-inf"))
        l = q.new_zeros(B, H, i1 - i0)
        acc = q.new_zeros(B, H, i1 - i0, hd)
        k_end = offset + i1 if causal else Tk
        if causal and mistake == "top-left":
            k_end = i1
        elif causal and mistake == "skip-diagonal":
            k_end = offset + i0   # Triton's off-band stage alone: the diagonal blocks are never visited
        elif causal and mistake == "one-block-too-many":
            k_end = min(offset + i1 + block_k, Tk)   # one more key block, entirely above the diagonal
        elif causal and mistake == "full-blocks-only":
            k_end = (offset + i0 + 1) // block_k * block_k   # the blocks every query sees, not the diagonal ones
        elif causal and mistake == "floor-blocks":
            k_end = (offset + i1) // block_k * block_k   # floor, not ceil: a ragged diagonal block is dropped
        for j0 in range(0, k_end, block_k):
            j1 = min(j0 + block_k, Tk)
            s = qi @ k[:, :, j0:j1].transpose(-2, -1)
            if causal and j1 - 1 > mask_offset + i0:
                rows = mask_offset + torch.arange(i0, i1, device=q.device)
                cols = torch.arange(j0, j1, device=q.device)
                s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
            # stats-over-queries: the max (and the sum below) over the tile's queries, one per key (B, H, bk): it
            # meets the per-query m and l where the tile is square (or one side is 1), and raises elsewhere.
            axis = -2 if mistake == "stats-over-queries" else -1
            m_new = torch.maximum(m, s.amax(dim=axis))
            p = torch.exp(s - m_new[..., None])
            alpha = torch.exp(m - m_new)
            pv = p @ v[:, :, j0:j1]
            if mistake == "no-rescale":   # the max moves on, what was summed under the old one stays
                l, acc = l + p.sum(dim=-1), acc + pv
            elif mistake == "rescale-acc-only":
                l, acc = l + p.sum(dim=-1), alpha[..., None] * acc + pv
            elif mistake == "rescale-sum-only":
                l, acc = alpha * l + p.sum(dim=-1), acc + pv
            elif mistake in IN_LOOP:
                # FlashAttention-1 keeps acc normalised: acc_new = (l_old * alpha * acc + pv) / l_new. These
                # drop l_old, drop l_old * alpha, or divide only the new tile's p v by the sum so far,
                # rescaling what acc held by alpha or keeping it as it was.
                l = alpha * l + p.sum(dim=-1)
                kept = {"divide-every-block": alpha / l, "drop-correction": 1 / l, "divide-tile-by-sum": alpha,
                        "add-tile-over-sum": torch.ones_like(l)}[mistake]
                acc = kept[..., None] * acc + pv / l[..., None]
            elif mistake == "stats-over-queries":
                l, acc = alpha * l + p.sum(dim=-2), alpha[..., None] * acc + pv
            elif mistake == "tile-softmax-over-queries":
                # p is its row sum times the tile's softmax over its keys; that softmax taken over the tile's
                # queries instead sums to 1 down each key's column (a key no query of the tile may see: 0).
                l = alpha * l + p.sum(dim=-1)
                w = torch.softmax(s, dim=-2).nan_to_num()   # (B, H, bq, bk)
                acc = alpha[..., None] * acc + (p.sum(dim=-1, keepdim=True) * w) @ v[:, :, j0:j1]
            elif mistake == "softmax-per-block":   # each tile's own softmax, the tiles' outputs added up
                l = alpha * l + p.sum(dim=-1)
                acc = acc + (p / p.sum(dim=-1, keepdim=True)) @ v[:, :, j0:j1]
            else:
                l = alpha * l + p.sum(dim=-1)
                acc = alpha[..., None] * acc + pv
            m = m_new
        normalised = mistake in IN_LOOP or mistake == "softmax-per-block"
        out[:, :, i0:i1] = acc if normalised else acc / l[..., None]
        lse[:, :, i0:i1] = torch.log(l) if mistake == "lse-log-l" else m + torch.log(l)
        ms[:, :, i0:i1], ls[:, :, i0:i1] = m, l
    return out, lse, ms, ls


def unscaled(q, k, v, block_q=64, block_k=64, causal=False):
    out, lse, _, _ = _tiled(q, k, v, block_q, block_k, causal, "no-scaling")
    return out, lse


def scaled_twice(q, k, v, block_q=64, block_k=64, causal=False):
    out, lse, _, _ = _tiled(q, k, v, block_q, block_k, causal, "double-scale")
    return out, lse


def missing_rescale(q, k, v, block_q=64, block_k=64, causal=False):
    out, lse, _, _ = _tiled(q, k, v, block_q, block_k, causal, "no-rescale")
    return out, lse


def missing_rescale_of_the_sum(q, k, v, block_q=64, block_k=64, causal=False):
    out, lse, _, _ = _tiled(q, k, v, block_q, block_k, causal, "rescale-acc-only")
    return out, lse


def rescale_sum_only(q, k, v, block_q=64, block_k=64, causal=False):
    out, lse, _, _ = _tiled(q, k, v, block_q, block_k, causal, "rescale-sum-only")
    return out, lse


def returns_running_max(q, k, v, block_q=64, block_k=64, causal=False):
    out, _, m, _ = _tiled(q, k, v, block_q, block_k, causal, None)
    return out, m   # the running max, without + log(l)


def returns_running_sum(q, k, v, block_q=64, block_k=64, causal=False):
    out, _, _, l = _tiled(q, k, v, block_q, block_k, causal, None)
    return out, l   # the running sum of exp(s - m), neither logged nor shifted by m


def returns_none(q, k, v, block_q=64, block_k=64, causal=False):
    out, _, _, _ = _tiled(q, k, v, block_q, block_k, causal, None)
    return out, None


def returns_out_alone(q, k, v, block_q=64, block_k=64, causal=False):
    out, _, _, _ = _tiled(q, k, v, block_q, block_k, causal, None)
    return out


def skips_the_diagonal_block(q, k, v, block_q=64, block_k=64, causal=False):
    out, lse, _, _ = _tiled(q, k, v, block_q, block_k, causal, "skip-diagonal")
    return out, lse


def only_blocks_below_the_diagonal(q, k, v, block_q=64, block_k=64, causal=False):
    out, lse, _, _ = _tiled(q, k, v, block_q, block_k, causal, "full-blocks-only")
    return out, lse


def one_key_block_too_many(q, k, v, block_q=64, block_k=64, causal=False):
    out, lse, _, _ = _tiled(q, k, v, block_q, block_k, causal, "one-block-too-many")
    return out, lse


def floor_divides_the_key_blocks(q, k, v, block_q=64, block_k=64, causal=False):
    out, lse, _, _ = _tiled(q, k, v, block_q, block_k, causal, "floor-blocks")
    return out, lse


def divides_every_block(q, k, v, block_q=64, block_k=64, causal=False):
    out, lse, _, _ = _tiled(q, k, v, block_q, block_k, causal, "divide-every-block")
    return out, lse


def drops_the_correction(q, k, v, block_q=64, block_k=64, causal=False):
    out, lse, _, _ = _tiled(q, k, v, block_q, block_k, causal, "drop-correction")   # (acc + pv) / l_new
    return out, lse


def divides_each_tile_by_the_sum_so_far(q, k, v, block_q=64, block_k=64, causal=False):
    out, lse, _, _ = _tiled(q, k, v, block_q, block_k, causal, "divide-tile-by-sum")   # alpha acc + pv / l_new
    return out, lse


def adds_each_tile_over_the_sum_so_far(q, k, v, block_q=64, block_k=64, causal=False):
    out, lse, _, _ = _tiled(q, k, v, block_q, block_k, causal, "add-tile-over-sum")   # acc + pv / l_new
    return out, lse


def softmax_per_block(q, k, v, block_q=64, block_k=64, causal=False):
    out, lse, _, _ = _tiled(q, k, v, block_q, block_k, causal, "softmax-per-block")
    return out, lse


def tile_softmax_over_the_queries(q, k, v, block_q=64, block_k=64, causal=False):
    out, lse, _, _ = _tiled(q, k, v, block_q, block_k, causal, "tile-softmax-over-queries")
    return out, lse


def running_max_and_sum_over_the_queries(q, k, v, block_q=64, block_k=64, causal=False):
    out, lse, _, _ = _tiled(q, k, v, block_q, block_k, causal, "stats-over-queries")   # s.amax(-2), p.sum(-2)
    return out, lse


def lse_without_the_max(q, k, v, block_q=64, block_k=64, causal=False):
    out, lse, _, _ = _tiled(q, k, v, block_q, block_k, causal, "lse-log-l")   # log(l): log sum exp(s) - m
    return out, lse


def top_left_causal(q, k, v, block_q=64, block_k=64, causal=False):
    out, lse, _, _ = _tiled(q, k, v, block_q, block_k, causal, "top-left")   # skipped and masked from position i
    return out, lse


def banned_api(q, k, v, block_q=64, block_k=64, causal=False):
    import torch.nn.functional as F

    _, lse, _, _ = _tiled(q, k, v, block_q, block_k, causal, None)   # lse by hand, the output from SDPA
    Tq, Tk = q.size(-2), k.size(-2)
    allowed = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq) if causal else None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed), lse


BUGS = {
    "missing-rescale": [{"flash_attention": missing_rescale}, {"flash_attention": missing_rescale_of_the_sum}],
    "rescale-sum-only": {"flash_attention": rescale_sum_only},
    "lse-not-returned": [{"flash_attention": returns_running_max}, {"flash_attention": returns_running_sum},
                         {"flash_attention": returns_none}, {"flash_attention": returns_out_alone}],
    "causal-block-skip-off-by-one": [{"flash_attention": skips_the_diagonal_block},
                                     {"flash_attention": only_blocks_below_the_diagonal},
                                     {"flash_attention": one_key_block_too_many},
                                     {"flash_attention": floor_divides_the_key_blocks}],
    "normalise-per-block": [{"flash_attention": divides_every_block}, {"flash_attention": softmax_per_block},
                            {"flash_attention": drops_the_correction},
                            {"flash_attention": divides_each_tile_by_the_sum_so_far},
                            {"flash_attention": adds_each_tile_over_the_sum_so_far}],
    "softmax-wrong-dim": [{"flash_attention": tile_softmax_over_the_queries},
                          {"flash_attention": running_max_and_sum_over_the_queries}],
    "lse-missing-max": {"flash_attention": lse_without_the_max},
    "mask-top-left-aligned": {"flash_attention": top_left_causal},
    "no-scaling": {"flash_attention": unscaled},
    "double-scale": {"flash_attention": scaled_twice},
    "banned-api": {"flash_attention": banned_api},
}
