"""The T x T form whose row sums are taken before the mask: the numerator is causal, the
normaliser sums the similarities of every key, future ones included."""
import torch
import torch.nn.functional as F


def elu_feature_map(x):
    return torch.where(x > 0, x + 1, torch.exp(x))


def linear_attention(q, k, v, causal=True):
    sim = elu_feature_map(q) @ elu_feature_map(k).transpose(-1, -2)   # (B, H, Tq, Tk)
    total = sim.sum(dim=-1, keepdim=True)
    if causal:
        T = sim.shape[-1]
        sim = sim * torch.tril(torch.ones(T, T, dtype=sim.dtype, device=sim.device))
    weights = sim / total
    return weights @ v


def linear_attention_step(q, k, v, state=None):
    fq, fk = elu_feature_map(q), elu_feature_map(k)
    if state is None:
        S = torch.zeros(fk.shape + (v.shape[-1],), dtype=k.dtype, device=k.device)
        z = torch.zeros_like(fk)
    else:
        S, z = state
    S = S + fk.unsqueeze(-1) * v.unsqueeze(-2)
    z = z + fk
    numerator = torch.einsum("bhd,bhde->bhe", fq, S)
    denominator = torch.einsum("bhd,bhd->bh", fq, z).unsqueeze(-1)
    return numerator / denominator, (S, z)
