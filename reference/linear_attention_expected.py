"""The linear-attention grader's expected values, written apart from the reference: the feature
map entry by entry, attention in its quadratic form (a T x T matrix of kernel similarities, each
weighted by a decay gamma^(i - j) written out in Python floats, normalised row by row), and the
running sums (S, z) added one token at a time in a loop.

They are answers as much as the reference is, so they stay out of student bundles with it: the
grader asks for them as ``bugs.expected``, which a bundle replays from its recordings.
"""
import torch


def feature_map(x):
    """elu(x) + 1 from its two branches: x + 1 above 0, exp(x) at or below."""
    return torch.where(x > 0, x + 1, torch.exp(torch.clamp(x, max=0)))


def kernel_attention(q, k, v, causal, gamma=1.0):
    """sim[i, j] = phi(q_i)·phi(k_j), times gamma^(i - j) and zeroed where j > i when causal, each
    row divided by its sum, times v: (B, H, Tq, dv)."""
    sim = feature_map(q) @ feature_map(k).transpose(-2, -1)   # (B, H, Tq, Tk), every entry > 0
    if causal:
        Tq, Tk = sim.shape[-2:]
        sim = sim * torch.tensor([[gamma ** (i - j) if j <= i else 0.0 for j in range(Tk)] for i in range(Tq)],
                                 dtype=sim.dtype)
    return (sim / sim.sum(dim=-1, keepdim=True)) @ v


def running_sums(k, v, gamma=1.0):
    """(S, z) after the tokens of k (B, H, T, d) and v (B, H, T, dv), added one at a time in a loop,
    the earlier ones faded by gamma at each: S (B, H, d, dv) = Σ gamma^(T-1-j) phi(k_j) v_jᵀ and
    z (B, H, d) = Σ gamma^(T-1-j) phi(k_j)."""
    S = torch.zeros(*k.shape[:2], k.shape[-1], v.shape[-1], dtype=k.dtype)
    z = torch.zeros(*k.shape[:2], k.shape[-1], dtype=k.dtype)
    for t in range(k.shape[-2]):
        phi = feature_map(k[..., t, :])
        S = gamma * S + phi[..., :, None] * v[..., t, None, :]
        z = gamma * z + phi
    return S, z
