import torch
import torch.nn.functional as F


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1, elementwise: x + 1 for x > 0, exp(x) otherwise. Same shape and dtype, > 0."""
    raise NotImplementedError("write elu_feature_map")


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """Linear attention with phi = elu + 1, in parallel over the tokens.

    q ``(B, H, Tq, d)``, k ``(B, H, Tk, d)``, v ``(B, H, Tk, dv)`` -> out ``(B, H, Tq, dv)``, in q's dtype.
    ``causal=True`` (q, k and v share T): out_t = phi(q_t)ᵀ S_t / phi(q_t)ᵀ z_t with the sums over
    j <= t, S_t = Σ phi(k_j) v_jᵀ ``(d, dv)`` and z_t = Σ phi(k_j) ``(d,)``. ``causal=False``: the
    sums run over every key.
    """
    raise NotImplementedError("write linear_attention")


def linear_attention_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state=None):
    """One token of causal linear attention, as an RNN.

    q, k ``(B, H, d)``, v ``(B, H, dv)``: the token at position t. ``state`` is ``(S, z)`` of the
    tokens before it, S ``(B, H, d, dv)`` and z ``(B, H, d)``, or None for none (S_0 = 0, z_0 = 0).
    Returns ``(out, (S, z))``: out ``(B, H, dv)``, row t of ``linear_attention(..., causal=True)``,
    and the state with this token added. Its size does not depend on t.
    """
    raise NotImplementedError("write linear_attention_step")
