"""FlashAttention's forward pass in PyTorch: attention one tile of scores at a time, with an online
softmax, so that the (Tq, Tk) score matrix is never built."""
import math

import torch


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_q: int = 64, block_k: int = 64,
                    causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ / sqrt(head_dim)) v, computed one (block_q, block_k) tile of scores at a time.

    q ``(B, H, Tq, head_dim)``, k and v ``(B, H, Tk, head_dim)``. Returns ``(out, lse)``: out
    ``(B, H, Tq, head_dim)`` and lse ``(B, H, Tq)``, the natural log of the sum of exp(score) over
    the keys each query may attend to, both in q's dtype. ``causal`` is bottom-right aligned:
    query i sits at position Tk - Tq + i and attends to keys 0 .. Tk - Tq + i; key blocks that
    lie entirely after a query block's last position are skipped, not masked. Raises ValueError
    when a block size is below 1, or when ``causal`` and Tq > Tk (the first queries would see no key).
    """
    B, H, Tq, hd = q.shape
    Tk = k.size(-2)
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block_q ({block_q}) and block_k ({block_k}) must be at least 1")
    if causal and Tq > Tk:
        raise ValueError(f"causal attention is bottom-right aligned: Tq ({Tq}) > Tk ({Tk}) would leave "
                         f"the first {Tq - Tk} queries without a key")
    scale = 1.0 / math.sqrt(hd)
    offset = Tk - Tq   # bottom-right: query i sits at position offset + i
    out = torch.empty_like(q)   # (B, H, Tq, hd)
    lse = q.new_empty(B, H, Tq)   # (B, H, Tq)
    for i0 in range(0, Tq, block_q):
        i1 = min(i0 + block_q, Tq)
        qi = q[:, :, i0:i1] * scale   # (B, H, bq, hd)
        m = q.new_full((B, H, i1 - i0), float("-inf"))   # running max of each query's scores
        l = q.new_zeros(B, H, i1 - i0)   # running sum of exp(score - m)
        acc = q.new_zeros(B, H, i1 - i0, hd)   # running sum of exp(score - m) * v, divided by l only at the end
        # causal: no query of this block sits after offset + i1 - 1, so later keys would only add exp(-inf) = 0.
        k_end = offset + i1 if causal else Tk
        for j0 in range(0, k_end, block_k):
            j1 = min(j0 + block_k, Tk)
            s = qi @ k[:, :, j0:j1].transpose(-2, -1)   # (B, H, bq, bk)
            if causal and j1 - 1 > offset + i0:   # the tile crosses the diagonal: mask inside it only
                rows = offset + torch.arange(i0, i1, device=q.device)   # (bq,) positions of the queries
                cols = torch.arange(j0, j1, device=q.device)   # (bk,) positions of the keys
                s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))   # (B, H, bq, bk)
            m_new = torch.maximum(m, s.amax(dim=-1))   # (B, H, bq)
            p = torch.exp(s - m_new[..., None])   # (B, H, bq, bk), each <= 1: no overflow
            # What was summed under the old max is re-expressed under the new one: exp(s - m_old) * exp(m_old - m_new).
            alpha = torch.exp(m - m_new)   # (B, H, bq), 0 on the first tile (m = -inf)
            l = alpha * l + p.sum(dim=-1)   # (B, H, bq)
            acc = alpha[..., None] * acc + p @ v[:, :, j0:j1]   # (B, H, bq, hd)
            m = m_new
        out[:, :, i0:i1] = acc / l[..., None]   # normalised once, after the last key block
        lse[:, :, i0:i1] = m + torch.log(l)   # log sum exp(s) = m + log sum exp(s - m)
    return out, lse
