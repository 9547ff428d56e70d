"""FlashAttention-1's normalised update with the ℓ_old factor forgotten: the output, already
divided by the old sum, is rescaled by e^{m_old - m_new} alone and divided by ℓ_new again, so every
block but the last is normalised away. Right with one key block, wrong with several."""
import math

import torch

NEG = -1e30


def flash_attention(q, k, v, block_q=64, block_k=64, causal=False):
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block_q={block_q}, block_k={block_k}: tiles need at least one row and column")
    B, H, N, d = q.shape
    M_k = k.shape[2]
    if causal and N > M_k:
        raise ValueError(f"causal: {N} queries but only {M_k} keys")
    tau = 1 / math.sqrt(d)
    O, L = torch.zeros_like(q), torch.zeros_like(q[..., 0])
    for i in range(0, N, block_q):
        Q_i = q[:, :, i:i + block_q]
        Br = Q_i.shape[2]
        O_i = torch.zeros_like(Q_i)
        l_i = torch.zeros_like(Q_i[..., 0])
        m_i = torch.full_like(Q_i[..., 0], -math.inf)
        last_key = M_k - N + i + Br - 1   # the block's last query may see keys 0 .. last_key
        n_blocks = last_key // block_k + 1 if causal else -(-M_k // block_k)
        for jb in range(n_blocks):
            j = jb * block_k
            K_j, V_j = k[:, :, j:j + block_k], v[:, :, j:j + block_k]
            S = tau * torch.einsum("bhid,bhjd->bhij", Q_i, K_j)
            if causal:
                q_pos = torch.arange(M_k - N + i, M_k - N + i + Br, device=q.device)
                k_pos = torch.arange(j, j + K_j.shape[2], device=q.device)
                S = torch.where(k_pos[None, :] <= q_pos[:, None], S, torch.full_like(S, NEG))
            m_tilde = S.amax(-1)
            P = torch.exp(S - m_tilde[..., None])
            l_tilde = P.sum(-1)
            m_new = torch.maximum(m_i, m_tilde)
            l_new = torch.exp(m_i - m_new) * l_i + torch.exp(m_tilde - m_new) * l_tilde
            O_i = (torch.exp(m_i - m_new)[..., None] * O_i
                   + torch.exp(m_tilde - m_new)[..., None] * torch.einsum("bhij,bhjd->bhid", P, V_j)) / l_new[..., None]
            l_i, m_i = l_new, m_new
        O[:, :, i:i + Br] = O_i
        L[:, :, i:i + Br] = m_i + torch.log(l_i)
    return O, L
