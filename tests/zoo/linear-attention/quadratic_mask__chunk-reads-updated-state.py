"""The chunked form in the T x T idiom, with the state updated as the step updates it, before the
read: each chunk's queries then read a state that holds their own chunk, later keys included, on
top of the masked matrix that holds it already."""
import torch
import torch.nn.functional as F


def elu_feature_map(x):
    return torch.where(x > 0, x + 1, torch.exp(x))


def decay_mask(T, gamma, dtype, device):
    pos = torch.arange(T, dtype=dtype, device=device)
    return torch.tril(torch.ones(T, T, dtype=dtype, device=device)) * gamma ** (pos[:, None] - pos[None, :])


def linear_attention(q, k, v, causal=True, gamma=1.0):
    if not causal and gamma != 1.0:
        raise ValueError("gamma != 1 requires causal=True")
    sim = elu_feature_map(q) @ elu_feature_map(k).transpose(-1, -2)   # (B, H, Tq, Tk)
    if causal:
        sim = sim * decay_mask(sim.shape[-1], gamma, sim.dtype, sim.device)
    weights = sim / sim.sum(dim=-1, keepdim=True)
    return weights @ v


def linear_attention_step(q, k, v, state=None, gamma=1.0):
    fq, fk = elu_feature_map(q), elu_feature_map(k)
    if state is None:
        S = torch.zeros(fk.shape + (v.shape[-1],), dtype=k.dtype, device=k.device)
        z = torch.zeros_like(fk)
    else:
        S, z = state
    S = gamma * S + fk.unsqueeze(-1) * v.unsqueeze(-2)
    z = gamma * z + fk
    numerator = torch.einsum("bhd,bhde->bhe", fq, S)
    denominator = torch.einsum("bhd,bhd->bh", fq, z).unsqueeze(-1)
    return numerator / denominator, (S, z)


def linear_attention_chunked(q, k, v, chunk_size, gamma=1.0):
    fq, fk = elu_feature_map(q), elu_feature_map(k)
    S = torch.zeros(fk.shape[:2] + (fk.shape[-1], v.shape[-1]), dtype=k.dtype, device=k.device)
    z = torch.zeros(fk.shape[:2] + (fk.shape[-1],), dtype=k.dtype, device=k.device)
    out = []
    for idx in torch.split(torch.arange(q.shape[2], device=q.device), chunk_size):
        qc, kc, vc = fq[:, :, idx], fk[:, :, idx], v[:, :, idx]
        n = len(idx)
        pos = torch.arange(n, dtype=fq.dtype, device=fq.device)
        sim = (qc @ kc.transpose(-1, -2)) * decay_mask(n, gamma, fq.dtype, fq.device)
        w = gamma ** (n - 1 - pos)
        S = gamma ** n * S + torch.einsum("bhcd,bhce,c->bhde", kc, vc, w)   # the chunk joins the state
        z = gamma ** n * z + torch.einsum("bhcd,c->bhd", kc, w)
        old = gamma ** (pos + 1)
        numerator = sim @ vc + old[:, None] * torch.einsum("bhcd,bhde->bhce", qc, S)
        denominator = sim.sum(dim=-1) + old * torch.einsum("bhcd,bhd->bhc", qc, z)
        out.append(numerator / denominator.unsqueeze(-1))
    return torch.cat(out, dim=2)
