"""The float32-accumulator kernel whose diagonal tiles are masked with torch.triu from the query's
own index, as for a square mask: the key loop still stops at the bottom-right diagonal, but inside
the tiles every key after query i's own index is hidden, top-left aligned."""
import math

import torch


def flash_attention(q, k, v, block_q=64, block_k=64, causal=False):
    if min(block_q, block_k) < 1:
        raise ValueError(f"block_q={block_q} and block_k={block_k} must be >= 1")
    B, H, Tq, D = q.shape
    Tk = k.shape[-2]
    if causal and Tq > Tk:
        raise ValueError(f"causal attention with Tq={Tq} > Tk={Tk}: the first queries would see no key")
    diag = Tk - Tq
    qf, kf, vf = q.float() / math.sqrt(D), k.float(), v.float()
    outs, lses = [], []
    for start in range(0, Tq, block_q):
        qb = qf[:, :, start:start + block_q]
        n = qb.shape[2]
        m = torch.full((B, H, n, 1), -float("inf"), device=q.device)
        l = torch.zeros(B, H, n, 1, device=q.device)
        acc = torch.zeros(B, H, n, D, device=q.device)
        stop = Tk if not causal else min(Tk, math.ceil((diag + start + n) / block_k) * block_k)
        for kstart in range(0, stop, block_k):
            kb, vb = kf[:, :, kstart:kstart + block_k], vf[:, :, kstart:kstart + block_k]
            s = torch.einsum("bhqd,bhkd->bhqk", qb, kb)
            if causal:
                # key kstart + c is after query start + r when c - r > start - kstart
                hidden = torch.ones(n, kb.shape[2], dtype=torch.bool, device=q.device).triu(start - kstart + 1)
                s = s.masked_fill(hidden, -float("inf"))
            m_new = torch.maximum(m, s.max(dim=-1, keepdim=True).values)
            scale = torch.exp(m - m_new)
            p = torch.exp(s - m_new)
            l = l * scale + p.sum(dim=-1, keepdim=True)
            acc = acc * scale + torch.einsum("bhqk,bhkd->bhqd", p, vb)
            m = m_new
        outs.append(acc / l)
        lses.append((m + l.log()).squeeze(-1))
    return torch.cat(outs, dim=2).to(q.dtype), torch.cat(lses, dim=2).to(q.dtype)
