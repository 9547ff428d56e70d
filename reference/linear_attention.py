"""Linear attention (Katharopoulos et al., 2020, "Transformers are RNNs") with RetNet's decay γ:
katas/linear-attention/README.md.

Softmax's exp(q·k) becomes a kernel phi(q)·phi(k) with phi(x) = elu(x) + 1, so the sum over the
keys factors out of the query: out_t = phi(q_t)ᵀ S_t / phi(q_t)ᵀ z_t, with S_t = γ S_{t-1} + phi(k_t) v_tᵀ
and z_t = γ z_{t-1} + phi(k_t). Key j weighs γ^(t-j) phi(q_t)·phi(k_j), and γ = 1 is the paper's
running sum. Three forms give the same numbers: in parallel (the keys folded first, or a T x T
matrix of decayed weights when causal), one token at a time with (S, z) as the fixed-size state of
an RNN, and in chunks (the T x T form inside each chunk, the state carried across).
"""
import torch
import torch.nn.functional as F


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1, elementwise: x + 1 for x > 0, exp(x) otherwise. Same shape and dtype, > 0."""
    return F.elu(x) + 1   # positive everywhere: every similarity phi(q)·phi(k) is > 0


def _decay(T: int, gamma: float, like: torch.Tensor) -> torch.Tensor:
    """(T, T) in like's dtype: gamma^(i - j) where key j <= query i, 0 above the diagonal (RetNet's D)."""
    t = torch.arange(T, dtype=like.dtype, device=like.device)   # (T,)
    return (gamma ** (t[:, None] - t[None, :])).tril()   # (T, T): above the diagonal gamma^(negative), zeroed


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
    if not causal and gamma != 1:
        raise ValueError(f"gamma = {gamma}: the decay runs along the causal order, so causal=False takes gamma = 1")
    q, k = elu_feature_map(q), elu_feature_map(k)   # (B, H, Tq, d), (B, H, Tk, d)
    if causal:
        # Key j's weight for query t: gamma^(t-j) phi(q_t)·phi(k_j), and 0 for the keys after t.
        weights = (q @ k.transpose(-2, -1)) * _decay(q.size(2), gamma, q)   # (B, H, T, T)
        return (weights @ v) / weights.sum(dim=-1, keepdim=True)   # (B, H, T, dv): each row divided by its sum
    # One sum for every query: the keys and values fold into a (d, dv) matrix first.
    S = k.transpose(-2, -1) @ v   # (B, H, d, dv)
    z = k.sum(dim=2, keepdim=True)   # (B, H, 1, d)
    return (q @ S) / (q * z).sum(dim=-1, keepdim=True)   # (B, H, Tq, dv): phi(q)ᵀ z > 0, no eps needed


def linear_attention_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state=None, gamma: float = 1.0):
    """One token of causal linear attention, as an RNN.

    q, k ``(B, H, d)``, v ``(B, H, dv)``: the token at position t. ``state`` is ``(S, z)`` of the
    tokens before it, S ``(B, H, d, dv)`` and z ``(B, H, d)``, or None for none (S_0 = 0, z_0 = 0).
    Returns ``(out, (S, z))``: out ``(B, H, dv)``, row t of ``linear_attention(..., causal=True,
    gamma=gamma)``, and the state with this token added: S_t = gamma S_{t-1} + phi(k_t) v_tᵀ,
    z_t = gamma z_{t-1} + phi(k_t). Its size does not depend on t.
    """
    q, k = elu_feature_map(q), elu_feature_map(k)   # (B, H, d)
    if state is None:
        S, z = k.new_zeros(*k.shape, v.size(-1)), torch.zeros_like(k)   # no token before this one
    else:
        S, z = state
    # The tokens before fade by gamma; this one enters whole (it is 0 tokens old).
    S = gamma * S + k[..., :, None] * v[..., None, :]   # (B, H, d, dv)
    z = gamma * z + k   # (B, H, d)
    num = (q[..., None, :] @ S).squeeze(-2)   # (B, H, dv)
    den = (q * z).sum(dim=-1, keepdim=True)   # (B, H, 1)
    return num / den, (S, z)


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
    q, k = elu_feature_map(q), elu_feature_map(k)   # (B, H, T, d)
    S = k.new_zeros(*k.shape[:2], k.size(-1), v.size(-1))   # (B, H, d, dv): the chunks before, none yet
    z = k.new_zeros(*k.shape[:2], k.size(-1))   # (B, H, d)
    outs = []
    for start in range(0, q.size(2), chunk_size):
        qc, kc, vc = (x[:, :, start:start + chunk_size] for x in (q, k, v))   # (B, H, C, d), (B, H, C, d), (B, H, C, dv)
        C = qc.size(2)   # chunk_size, or fewer in the last chunk
        i = torch.arange(C, dtype=q.dtype, device=q.device)   # (C,): positions inside the chunk
        inner = (qc @ kc.transpose(-2, -1)) * _decay(C, gamma, q)   # (B, H, C, C): the chunk's own keys
        # The state holds the tokens before the chunk: the last of them is i + 1 tokens before query i.
        read = (gamma ** (i + 1))[:, None]   # (C, 1)
        num = inner @ vc + read * (qc @ S)   # (B, H, C, dv)
        den = inner.sum(dim=-1, keepdim=True) + read * (qc @ z[..., None])   # (B, H, C, 1)
        outs.append(num / den)
        # Only now add the chunk to the state: the old state fades by gamma^C, key j by gamma^(C-1-j).
        fade = (gamma ** (C - 1 - i))[:, None]   # (C, 1)
        S = gamma ** C * S + (kc * fade).transpose(-2, -1) @ vc   # (B, H, d, dv)
        z = gamma ** C * z + (kc * fade).sum(dim=2)   # (B, H, d)
    return torch.cat(outs, dim=2)   # (B, H, T, dv)
