"""The loop-over-the-RNN answer whose step decays after adding: S = gamma * (S + phi(k) vᵀ), so
this token already weighs gamma. The outputs come out right (the extra gamma cancels in the
ratio), the causal form that loops over the step too; the state returned is gamma times too small."""
import torch
import torch.nn.functional as F


def elu_feature_map(x):
    return F.elu(x) + 1.0


def linear_attention(q, k, v, causal=True, gamma=1.0):
    if causal:
        state = None
        outputs = []
        for t in range(q.size(2)):
            out, state = linear_attention_step(q[:, :, t], k[:, :, t], v[:, :, t], state, gamma)
            outputs.append(out)
        return torch.stack(outputs, dim=2)
    if gamma != 1.0:
        raise ValueError("the decay is defined along the causal order only")
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    kv = torch.matmul(phi_k.transpose(2, 3), v)          # (B, H, d, dv)
    normaliser = torch.matmul(phi_q, phi_k.sum(dim=2).unsqueeze(-1))   # (B, H, Tq, 1)
    return torch.matmul(phi_q, kv) / normaliser


def linear_attention_step(q, k, v, state=None, gamma=1.0):
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    B, H, d = phi_k.shape
    if state is None:
        S = torch.zeros(B, H, d, v.size(-1), dtype=v.dtype, device=v.device)
        z = torch.zeros(B, H, d, dtype=v.dtype, device=v.device)
    else:
        S, z = state
    S = gamma * (S + torch.matmul(phi_k.unsqueeze(-1), v.unsqueeze(-2)))
    z = gamma * (z + phi_k)
    out = torch.matmul(phi_q.unsqueeze(-2), S).squeeze(-2)
    out = out / torch.matmul(phi_q.unsqueeze(-2), z.unsqueeze(-1)).squeeze(-1)
    return out, (S, z)


def linear_attention_chunked(q, k, v, chunk_size, gamma=1.0):
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    B, H, T, d = phi_k.shape
    S = torch.zeros(B, H, d, v.size(-1), dtype=v.dtype, device=v.device)
    z = torch.zeros(B, H, d, dtype=v.dtype, device=v.device)
    outputs = []
    for start in range(0, T, chunk_size):
        end = min(start + chunk_size, T)
        for t in range(start, end):
            # The chunks before, through the state: its last token is t - start + 1 tokens back.
            old = gamma ** (t - start + 1)
            numerator = old * torch.matmul(phi_q[:, :, t].unsqueeze(-2), S).squeeze(-2)
            denominator = old * torch.matmul(phi_q[:, :, t].unsqueeze(-2), z.unsqueeze(-1)).squeeze(-1)
            for j in range(start, t + 1):
                weight = gamma ** (t - j) * torch.matmul(phi_q[:, :, t].unsqueeze(-2), phi_k[:, :, j].unsqueeze(-1)).squeeze(-1)
                numerator = numerator + weight * v[:, :, j]
                denominator = denominator + weight
            outputs.append(numerator / denominator)
        S = gamma ** (end - start) * S
        z = gamma ** (end - start) * z
        for j in range(start, end):
            S = S + gamma ** (end - 1 - j) * torch.matmul(phi_k[:, :, j].unsqueeze(-1), v[:, :, j].unsqueeze(-2))
            z = z + gamma ** (end - 1 - j) * phi_k[:, :, j]
    return torch.stack(outputs, dim=2)
