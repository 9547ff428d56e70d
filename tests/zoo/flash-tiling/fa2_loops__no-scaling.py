"""The FlashAttention-2 paper's Algorithm 1 with explicit loops, its tiles' scores never scaled:
`S_ij = Q_i @ K_j.T`, as the paper's pseudocode writes it, leaving the softmax scale aside. Every
score is sqrt(d) times too large and every softmax too sharp."""
import math

import torch


def flash_attention(q, k, v, block_q=64, block_k=64, causal=False):
    B, H, N_q, d = q.shape
    N_k = k.shape[2]
    if block_q <= 0 or block_k <= 0:
        raise ValueError(f"block sizes must be positive, got B_r={block_q}, B_c={block_k}")
    if causal and N_q > N_k:
        raise ValueError(f"causal needs N_q <= N_k, got {N_q} > {N_k}")
    B_r, B_c = block_q, block_k
    T_r, T_c = math.ceil(N_q / B_r), math.ceil(N_k / B_c)
    shift = N_k - N_q
    O = torch.zeros_like(q)
    L = torch.zeros(B, H, N_q, dtype=q.dtype, device=q.device)
    for b in range(B):
        for h in range(H):
            for i in range(T_r):
                Q_i = q[b, h, i * B_r:(i + 1) * B_r]
                rows = Q_i.shape[0]
                O_i = torch.zeros(rows, d, dtype=q.dtype, device=q.device)
                l_i = torch.zeros(rows, dtype=q.dtype, device=q.device)
                m_i = torch.full((rows,), -math.inf, dtype=q.dtype, device=q.device)
                last = i * B_r + rows - 1 + shift   # position of the block's last query
                for j in range(T_c if not causal else min(T_c, last // B_c + 1)):
                    K_j, V_j = k[b, h, j * B_c:(j + 1) * B_c], v[b, h, j * B_c:(j + 1) * B_c]
                    S_ij = Q_i @ K_j.T
                    if causal:
                        q_pos = torch.arange(i * B_r, i * B_r + rows, device=q.device)[:, None] + shift
                        k_pos = torch.arange(j * B_c, j * B_c + K_j.shape[0], device=q.device)[None, :]
                        S_ij = torch.where(k_pos <= q_pos, S_ij, torch.tensor(-math.inf, dtype=q.dtype, device=q.device))
                    m_new = torch.maximum(m_i, S_ij.max(dim=1).values)
                    P_ij = torch.exp(S_ij - m_new[:, None])
                    l_i = torch.exp(m_i - m_new) * l_i + P_ij.sum(dim=1)
                    O_i = torch.diag(torch.exp(m_i - m_new)) @ O_i + P_ij @ V_j
                    m_i = m_new
                O[b, h, i * B_r:i * B_r + rows] = torch.diag(1.0 / l_i) @ O_i
                L[b, h, i * B_r:i * B_r + rows] = m_i + torch.log(l_i)
    return O, L
