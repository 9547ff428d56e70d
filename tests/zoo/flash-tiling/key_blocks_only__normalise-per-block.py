"""FlashAttention-1's loop order (one loop over key blocks, every query at once) with its in-loop
normalisation written without the correction: o_new = (o + p v_j) / l_new, where FlashAttention-1
multiplies the old output by l_old · exp(m_old - m_new) first. What o held, already divided by the
old sum, is divided again by every later block's."""
import torch


def flash_attention(q, k, v, block_q=64, block_k=64, causal=False):
    if block_q < 1 or block_k < 1:
        raise ValueError("block_q and block_k must be positive")
    Tq, Tk, hd = q.size(2), k.size(2), q.size(3)
    if causal and Tq > Tk:
        raise ValueError(f"causal: Tq={Tq} > Tk={Tk}")
    shift = Tk - Tq
    q = q * hd ** -0.5
    m = torch.full(q.shape[:3], float("-inf"), dtype=q.dtype, device=q.device)
    l = torch.zeros(q.shape[:3], dtype=q.dtype, device=q.device)
    o = torch.zeros_like(q)
    for j0 in range(0, Tk, block_k):
        kj, vj = k[:, :, j0:j0 + block_k], v[:, :, j0:j0 + block_k]
        r0 = max(0, j0 - shift) if causal else 0   # queries before r0 sit before every key of this block
        s = q[:, :, r0:] @ kj.mT
        if causal:
            qpos = torch.arange(r0, Tq, device=q.device) + shift
            kpos = torch.arange(j0, j0 + kj.size(2), device=q.device)
            s = s.masked_fill(kpos > qpos[:, None], float("-inf"))
        m_old = m[:, :, r0:]
        m_new = torch.maximum(m_old, s.amax(-1))
        p = (s - m_new.unsqueeze(-1)).exp()
        c = (m_old - m_new).exp()
        l[:, :, r0:] = c * l[:, :, r0:] + p.sum(-1)
        o[:, :, r0:] = (o[:, :, r0:] + p @ vj) / l[:, :, r0:].unsqueeze(-1)
        m[:, :, r0:] = m_new
    return o, m + l.log()
