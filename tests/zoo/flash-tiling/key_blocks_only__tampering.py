"""The key-blocks-only version with its exponential looked up by name, `getattr(torch, NORMALISE)`,
so that it can be switched to exp2: a computed attribute the grader cannot follow, so the checks of
what the function calls and builds cannot trust what they recorded."""
import torch

NORMALISE = "exp"


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
        p = getattr(torch, NORMALISE)(s - m_new.unsqueeze(-1))
        c = (m_old - m_new).exp()
        l[:, :, r0:] = c * l[:, :, r0:] + p.sum(-1)
        o[:, :, r0:] = c.unsqueeze(-1) * o[:, :, r0:] + p @ vj
        m[:, :, r0:] = m_new
    return o / l.unsqueeze(-1), m + l.log()
