"""Known linear-attention bugs, each the reference with exactly that mistake."""
import torch

from reference.linear_attention import elu_feature_map, linear_attention, linear_attention_step


def _numerator(q, k, v, causal):
    """phi(q_t)ᵀ S_t alone: the reference's sums, never divided."""
    q, k = elu_feature_map(q), elu_feature_map(k)
    if causal:
        return torch.einsum("bhtd,bhtde->bhte", q, torch.einsum("bhtd,bhte->bhtde", k, v).cumsum(dim=2))
    return q @ (k.transpose(-2, -1) @ v)


def attention_unnormalised(q, k, v, causal=True):
    return _numerator(q, k, v, causal)   # phi(q_t)ᵀ S_t: the division by phi(q_t)ᵀ z_t forgotten


def step_unnormalised(q, k, v, state=None):
    out, (S, z) = linear_attention_step(q, k, v, state)
    return (elu_feature_map(q)[..., None, :] @ S).squeeze(-2), (S, z)   # not divided by phi(q)ᵀ z


def attention_sums_every_key(q, k, v, causal=True):
    return linear_attention(q, k, v, causal=False)   # S and z over all T keys, the future's too


def attention_normaliser_sums_every_key(q, k, v, causal=True):
    if not causal:
        return linear_attention(q, k, v, causal=False)
    z = elu_feature_map(k).sum(dim=2, keepdim=True)   # (B, H, 1, d): z_T for every t, not z_t
    return _numerator(q, k, v, True) / (elu_feature_map(q) * z).sum(dim=-1, keepdim=True)


def attention_phi_on_values(q, k, v, causal=True):
    return linear_attention(q, k, elu_feature_map(v), causal)   # v is no feature: only q and k are mapped


def step_phi_on_values(q, k, v, state=None):
    return linear_attention_step(q, k, elu_feature_map(v), state)


def _read_before_update(q, k, v, state, eps):
    phi_q = elu_feature_map(q)
    S, z = (k.new_zeros(*k.shape, v.size(-1)), torch.zeros_like(k)) if state is None else state
    out = (phi_q[..., None, :] @ S).squeeze(-2) / ((phi_q * z).sum(dim=-1, keepdim=True) + eps)   # S_{t-1}, z_{t-1}
    return out, linear_attention_step(q, k, v, state)[1]   # the state updated right, after the readout


def step_output_before_update(q, k, v, state=None):
    """The output read before this token is added to (S, z), as an RNN cell reads h_{t-1}: from
    state=None the first token reads empty sums (0 / 0, NaN), and every later one misses itself."""
    return _read_before_update(q, k, v, state, 0.0)


def step_output_before_update_eps(q, k, v, state=None):
    return _read_before_update(q, k, v, state, 1e-6)   # fast-transformers' eps: 0, not NaN, at the first token


def step_kv_cache_as_state(q, k, v, state=None):
    """The state is every key and value so far, (K (B, H, t, d), V (B, H, t, dv)): a KV cache, from
    which each step recomputes the sums. Right outputs, and a state that grows by a token a step."""
    K, V = (k[..., None, :], v[..., None, :]) if state is None else \
        (torch.cat([state[0], k[..., None, :]], dim=-2), torch.cat([state[1], v[..., None, :]], dim=-2))
    S = elu_feature_map(K).transpose(-2, -1) @ V   # (B, H, d, dv)
    z = elu_feature_map(K).sum(dim=-2)   # (B, H, d)
    phi_q = elu_feature_map(q)
    return (phi_q[..., None, :] @ S).squeeze(-2) / (phi_q * z).sum(dim=-1, keepdim=True), (K, V)


_TOKENS = []   # every token stepped, kept beside the state "for a later prefill"


def step_keeps_every_token(q, k, v, state=None):
    _TOKENS.append((k, v))   # the state is right, and the module holds the whole stream besides
    return linear_attention_step(q, k, v, state)


BUGS = {
    "normaliser-forgotten": [{"linear_attention": attention_unnormalised, "linear_attention_step": step_unnormalised},
                             {"linear_attention_step": step_unnormalised}],
    "non-causal-sum": [{"linear_attention": attention_sums_every_key},
                       {"linear_attention": attention_normaliser_sums_every_key}],
    "feature-map-on-values": [{"linear_attention": attention_phi_on_values, "linear_attention_step": step_phi_on_values},
                              {"linear_attention_step": step_phi_on_values}],
    "step-output-before-update": [{"linear_attention_step": step_output_before_update},
                                  {"linear_attention_step": step_output_before_update_eps}],
    "state-grows-with-t": [{"linear_attention_step": step_kv_cache_as_state},
                           {"linear_attention_step": step_keeps_every_token}],
}
