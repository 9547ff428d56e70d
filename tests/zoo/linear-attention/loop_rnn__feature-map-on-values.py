"""The loop-over-the-RNN answer with phi applied to the values too, in the step: the causal form,
which loops over the step, inherits it; the non-causal form is right."""
import torch
import torch.nn.functional as F


def elu_feature_map(x):
    return F.elu(x) + 1.0


def linear_attention(q, k, v, causal=True):
    if causal:
        state = None
        outputs = []
        for t in range(q.size(2)):
            out, state = linear_attention_step(q[:, :, t], k[:, :, t], v[:, :, t], state)
            outputs.append(out)
        return torch.stack(outputs, dim=2)
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    kv = torch.matmul(phi_k.transpose(2, 3), v)          # (B, H, d, dv)
    normaliser = torch.matmul(phi_q, phi_k.sum(dim=2).unsqueeze(-1))   # (B, H, Tq, 1)
    return torch.matmul(phi_q, kv) / normaliser


def linear_attention_step(q, k, v, state=None):
    phi_q, phi_k, v = elu_feature_map(q), elu_feature_map(k), elu_feature_map(v)
    B, H, d = phi_k.shape
    if state is None:
        S = torch.zeros(B, H, d, v.size(-1), dtype=v.dtype, device=v.device)
        z = torch.zeros(B, H, d, dtype=v.dtype, device=v.device)
    else:
        S, z = state
    S = S + torch.matmul(phi_k.unsqueeze(-1), v.unsqueeze(-2))
    z = z + phi_k
    out = torch.matmul(phi_q.unsqueeze(-2), S).squeeze(-2)
    out = out / torch.matmul(phi_q.unsqueeze(-2), z.unsqueeze(-1)).squeeze(-1)
    return out, (S, z)
