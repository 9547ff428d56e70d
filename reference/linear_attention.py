"""Linear attention (Katharopoulos et al., 2020, "Transformers are RNNs"): katas/linear-attention/README.md.

Softmax's exp(q·k) becomes a kernel phi(q)·phi(k) with phi(x) = elu(x) + 1, so the sum over the
keys factors out of the query: out_t = phi(q_t)ᵀ S_t / phi(q_t)ᵀ z_t, with S_t = Σ_{j<=t} phi(k_j) v_jᵀ
and z_t = Σ_{j<=t} phi(k_j). Computed for every t at once (a cumulative sum), or one token at a
time with (S, z) as the fixed-size state of an RNN.
"""
import torch
import torch.nn.functional as F


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1, elementwise: x + 1 for x > 0, exp(x) otherwise. Same shape and dtype, > 0."""
    return F.elu(x) + 1   # positive everywhere: every similarity phi(q)·phi(k) is > 0


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """Linear attention with phi = elu + 1, in parallel over the tokens.

    q ``(B, H, Tq, d)``, k ``(B, H, Tk, d)``, v ``(B, H, Tk, dv)`` -> out ``(B, H, Tq, dv)``, in q's dtype.
    ``causal=True`` (q, k and v share T): out_t = phi(q_t)ᵀ S_t / phi(q_t)ᵀ z_t with the sums over
    j <= t, S_t = Σ phi(k_j) v_jᵀ ``(d, dv)`` and z_t = Σ phi(k_j) ``(d,)``. ``causal=False``: the
    sums run over every key.
    """
    q, k = elu_feature_map(q), elu_feature_map(k)   # (B, H, Tq, d), (B, H, Tk, d)
    if causal:
        # S_t and z_t for every t at once: running sums over the keys up to t.
        S = torch.einsum("bhtd,bhte->bhtde", k, v).cumsum(dim=2)   # (B, H, T, d, dv)
        z = k.cumsum(dim=2)   # (B, H, T, d)
        num = torch.einsum("bhtd,bhtde->bhte", q, S)   # (B, H, T, dv)
    else:
        # One sum for every query: the keys and values fold into a (d, dv) matrix first.
        S = k.transpose(-2, -1) @ v   # (B, H, d, dv)
        z = k.sum(dim=2, keepdim=True)   # (B, H, 1, d)
        num = q @ S   # (B, H, Tq, dv)
    den = (q * z).sum(dim=-1, keepdim=True)   # (B, H, Tq, 1): phi(q_t)ᵀ z_t > 0, no eps needed
    return num / den   # (B, H, Tq, dv)


def linear_attention_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state=None):
    """One token of causal linear attention, as an RNN.

    q, k ``(B, H, d)``, v ``(B, H, dv)``: the token at position t. ``state`` is ``(S, z)`` of the
    tokens before it, S ``(B, H, d, dv)`` and z ``(B, H, d)``, or None for none (S_0 = 0, z_0 = 0).
    Returns ``(out, (S, z))``: out ``(B, H, dv)``, row t of ``linear_attention(..., causal=True)``,
    and the state with this token added. Its size does not depend on t.
    """
    q, k = elu_feature_map(q), elu_feature_map(k)   # (B, H, d)
    if state is None:
        S, z = k.new_zeros(*k.shape, v.size(-1)), torch.zeros_like(k)   # no token before this one
    else:
        S, z = state
    S = S + k[..., :, None] * v[..., None, :]   # (B, H, d, dv): S_t = S_{t-1} + phi(k_t) v_tᵀ
    z = z + k   # (B, H, d): z_t = z_{t-1} + phi(k_t)
    num = (q[..., None, :] @ S).squeeze(-2)   # (B, H, dv)
    den = (q * z).sum(dim=-1, keepdim=True)   # (B, H, 1)
    return num / den, (S, z)
