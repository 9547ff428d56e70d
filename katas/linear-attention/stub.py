import torch
import torch.nn.functional as F


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1, elementwise: x + 1 for x > 0, exp(x) otherwise. Same shape and dtype, > 0."""
    raise NotImplementedError("write elu_feature_map")


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                     gamma: float = 1.0) -> torch.Tensor:
    """Linear attention with phi = elu + 1, in parallel over the tokens.

    q ``(B, H, Tq, d)``, k ``(B, H, Tk, d)``, v ``(B, H, Tk, dv)`` -> out ``(B, H, Tq, dv)``, in q's dtype.
    ``causal=True`` (q, k and v share T): out_t = phi(q_t)ᵀ S_t / phi(q_t)ᵀ z_t with the sums over
    j <= t, S_t = Σ gamma^(t-j) phi(k_j) v_jᵀ ``(d, dv)`` and z_t = Σ gamma^(t-j) phi(k_j) ``(d,)``:
    a key fades by ``gamma`` (0 < gamma <= 1) for every token after it. ``causal=False``: the sums
    run over every key, undecayed; a ``gamma`` other than 1 raises ValueError, since the decay runs
    along the causal order.
    """
    raise NotImplementedError("write linear_attention")


def linear_attention_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state=None, gamma: float = 1.0):
    """One token of causal linear attention, as an RNN.

    q, k ``(B, H, d)``, v ``(B, H, dv)``: the token at position t. ``state`` is ``(S, z)`` of the
    tokens before it, S ``(B, H, d, dv)`` and z ``(B, H, d)``, or None for none (S_0 = 0, z_0 = 0).
    Returns ``(out, (S, z))``: out ``(B, H, dv)``, row t of ``linear_attention(..., causal=True,
    gamma=gamma)``, and the state with this token added: S_t = gamma S_{t-1} + phi(k_t) v_tᵀ,
    z_t = gamma z_{t-1} + phi(k_t). Its size does not depend on t.
    """
    raise NotImplementedError("write linear_attention_step")


def linear_attention_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int,
                             gamma: float = 1.0) -> torch.Tensor:
    """Causal linear attention computed chunk by chunk, as flash-linear-attention and RetNet train.

    q, k ``(B, H, T, d)``, v ``(B, H, T, dv)`` -> ``(B, H, T, dv)``, equal to ``linear_attention(q, k, v,
    causal=True, gamma=gamma)``. The tokens are cut into chunks of ``chunk_size`` (the last may be
    shorter). Inside a chunk: the masked, decayed similarities gamma^(i-j) phi(q_i)·phi(k_j) of its
    own keys, times v and summed (numerator and denominator). Across chunks: the state (S, z) of the
    tokens before the chunk, as linear_attention_step keeps it, read by each query, then carried past
    the chunk. Nothing of size T x T or (T, d, dv) is built when chunk_size < T.
    """
    raise NotImplementedError("write linear_attention_chunked")
