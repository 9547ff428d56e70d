"""The attention-backward grader's expected values that autograd does not give: the softmax's
vector-Jacobian product with each row's Jacobian built explicitly, apart from the reference.

It is an answer as much as the reference is, so it stays out of student bundles with it: the
grader asks for it as ``bugs.expected``, which a bundle replays from its recordings.
"""
import torch


def jacobian_product(p, dp):
    """ds = J dp with each row's softmax Jacobian J = diag(p) - p pᵀ built explicitly, in float64."""
    p64, dp64 = p.double(), dp.double()
    J = torch.diag_embed(p64) - p64.unsqueeze(-1) * p64.unsqueeze(-2)   # (..., T, T)
    return (J @ dp64.unsqueeze(-1)).squeeze(-1).to(p.dtype)   # (..., T)
