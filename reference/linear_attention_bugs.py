"""Known linear-attention bugs, each the reference with exactly that mistake."""
import torch

from reference.linear_attention import _decay, elu_feature_map, linear_attention, linear_attention_step


def _refuse(causal, gamma):
    """The reference's own refusal: the decay runs along the causal order."""
    if not causal and gamma != 1:
        raise ValueError(f"gamma = {gamma}: causal=False takes gamma = 1")


def _weights(q, k, gamma):
    """The reference's causal weights gamma^(t-j) phi(q_t)·phi(k_j), 0 after t: (B, H, T, T)."""
    return (elu_feature_map(q) @ elu_feature_map(k).transpose(-2, -1)) * _decay(q.size(2), gamma, q)


def _new_state(k, v, state):
    return (k.new_zeros(*k.shape, v.size(-1)), torch.zeros_like(k)) if state is None else state


def _read(phi_q, S, z):
    return (phi_q[..., None, :] @ S).squeeze(-2) / (phi_q * z).sum(dim=-1, keepdim=True)


def attention_unnormalised(q, k, v, causal=True, gamma=1.0):
    _refuse(causal, gamma)
    if causal:
        return _weights(q, k, gamma) @ v   # phi(q_t)ᵀ S_t: the division by phi(q_t)ᵀ z_t forgotten
    return elu_feature_map(q) @ (elu_feature_map(k).transpose(-2, -1) @ v)


def step_unnormalised(q, k, v, state=None, gamma=1.0):
    out, (S, z) = linear_attention_step(q, k, v, state, gamma)
    return (elu_feature_map(q)[..., None, :] @ S).squeeze(-2), (S, z)   # not divided by phi(q)ᵀ z


def attention_sums_every_key(q, k, v, causal=True, gamma=1.0):
    _refuse(causal, gamma)
    return linear_attention(q, k, v, causal=False)   # S and z over all T keys, the future's too


def attention_normaliser_sums_every_key(q, k, v, causal=True, gamma=1.0):
    _refuse(causal, gamma)
    if not causal:
        return linear_attention(q, k, v, causal=False)
    z = elu_feature_map(k).sum(dim=2, keepdim=True)   # (B, H, 1, d): every key's, not those up to t
    return (_weights(q, k, gamma) @ v) / (elu_feature_map(q) * z).sum(dim=-1, keepdim=True)


def attention_phi_on_values(q, k, v, causal=True, gamma=1.0):
    return linear_attention(q, k, elu_feature_map(v), causal, gamma)   # v is no feature: only q and k are mapped


def step_phi_on_values(q, k, v, state=None, gamma=1.0):
    return linear_attention_step(q, k, elu_feature_map(v), state, gamma)


def _read_before_update(q, k, v, state, gamma, eps):
    phi_q = elu_feature_map(q)
    S, z = _new_state(k, v, state)
    out = (phi_q[..., None, :] @ S).squeeze(-2) / ((phi_q * z).sum(dim=-1, keepdim=True) + eps)   # S_{t-1}, z_{t-1}
    return out, linear_attention_step(q, k, v, state, gamma)[1]   # the state updated right, after the readout


def step_output_before_update(q, k, v, state=None, gamma=1.0):
    """The output read before this token is added to (S, z), as an RNN cell reads h_{t-1}: from
    state=None the first token reads empty sums (0 / 0, NaN), and every later one misses itself."""
    return _read_before_update(q, k, v, state, gamma, 0.0)


def step_output_before_update_eps(q, k, v, state=None, gamma=1.0):
    return _read_before_update(q, k, v, state, gamma, 1e-6)   # fast-transformers' eps: 0, not NaN, at the first token


def step_kv_cache_as_state(q, k, v, state=None, gamma=1.0):
    """The state is every key and value so far, (K (B, H, t, d), V (B, H, t, dv)): a KV cache, from
    which each step recomputes the sums. Right outputs, and a state that grows by a token a step."""
    K, V = (k[..., None, :], v[..., None, :]) if state is None else \
        (torch.cat([state[0], k[..., None, :]], dim=-2), torch.cat([state[1], v[..., None, :]], dim=-2))
    age = torch.arange(K.size(-2) - 1, -1, -1, dtype=K.dtype)   # (t,): tokens since each key
    phi_K = elu_feature_map(K) * (gamma ** age)[:, None]   # (B, H, t, d): each key faded by its age
    phi_q = elu_feature_map(q)
    return _read(phi_q, phi_K.transpose(-2, -1) @ V, phi_K.sum(dim=-2)), (K, V)


_TOKENS = []   # every token stepped, kept beside the state "for a later prefill"


def step_keeps_every_token(q, k, v, state=None, gamma=1.0):
    _TOKENS.append((k, v))   # the state is right, and the module holds the whole stream besides
    return linear_attention_step(q, k, v, state, gamma)


def step_decays_after_adding(q, k, v, state=None, gamma=1.0):
    """S_t = gamma (S_{t-1} + phi(k_t) v_tᵀ): the token is decayed on the step it arrives, so key j
    weighs gamma^(t-j+1). The output's ratio cancels the extra gamma; the state returned does not."""
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    S, z = _new_state(phi_k, v, state)
    S = gamma * (S + phi_k[..., :, None] * v[..., None, :])
    z = gamma * (z + phi_k)
    return _read(phi_q, S, z), (S, z)


def attention_normaliser_undecayed(q, k, v, causal=True, gamma=1.0):
    _refuse(causal, gamma)
    if not causal:
        return linear_attention(q, k, v, causal=False)
    den = _weights(q, k, 1.0).sum(dim=-1, keepdim=True)   # (B, H, T, 1): the similarities summed undecayed
    return (_weights(q, k, gamma) @ v) / den


def step_normaliser_undecayed(q, k, v, state=None, gamma=1.0):
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    S, z = _new_state(phi_k, v, state)
    S = gamma * S + phi_k[..., :, None] * v[..., None, :]
    z = z + phi_k   # z_t = z_{t-1} + phi(k_t): a running sum while S fades
    return _read(phi_q, S, z), (S, z)


def _chunked(q, k, v, chunk_size, gamma, *, den_gamma=None, carry=True, read=True, add_first=False):
    """The reference's chunked form, with one of its steps changed: ``den_gamma`` the decay of the
    denominator (z) where it is not gamma, ``carry=False`` the state carried past a chunk without
    its gamma^C, ``read=False`` the state read without gamma^(i+1), ``add_first`` the chunk added
    to the state before its queries read it."""
    q, k = elu_feature_map(q), elu_feature_map(k)
    g_num, g_den = gamma, gamma if den_gamma is None else den_gamma
    S, z = k.new_zeros(*k.shape[:2], k.size(-1), v.size(-1)), k.new_zeros(*k.shape[:2], k.size(-1))
    outs = []
    for start in range(0, q.size(2), chunk_size):
        qc, kc, vc = (x[:, :, start:start + chunk_size] for x in (q, k, v))
        C = qc.size(2)
        i = torch.arange(C, dtype=q.dtype)
        sim = qc @ kc.transpose(-2, -1)   # (B, H, C, C)
        inner_num, inner_den = sim * _decay(C, g_num, q), sim * _decay(C, g_den, q)

        def carried(S, z):
            S = (g_num ** C if carry else 1.0) * S + (kc * (g_num ** (C - 1 - i))[:, None]).transpose(-2, -1) @ vc
            z = (g_den ** C if carry else 1.0) * z + (kc * (g_den ** (C - 1 - i))[:, None]).sum(dim=2)
            return S, z

        if add_first:
            S, z = carried(S, z)
        r_num = (g_num ** (i + 1))[:, None] if read else 1.0
        r_den = (g_den ** (i + 1))[:, None] if read else 1.0
        num = inner_num @ vc + r_num * (qc @ S)
        den = inner_den.sum(dim=-1, keepdim=True) + r_den * (qc @ z[..., None])
        outs.append(num / den)
        if not add_first:
            S, z = carried(S, z)
    return torch.cat(outs, dim=2)


def chunked_normaliser_undecayed(q, k, v, chunk_size, gamma=1.0):
    return _chunked(q, k, v, chunk_size, gamma, den_gamma=1.0)   # z summed undecayed, chunk by chunk


def chunked_state_carried_undecayed(q, k, v, chunk_size, gamma=1.0):
    return _chunked(q, k, v, chunk_size, gamma, carry=False)   # S = S + the chunk's keys: no gamma^C on the old state


def chunked_state_read_undecayed(q, k, v, chunk_size, gamma=1.0):
    return _chunked(q, k, v, chunk_size, gamma, read=False)   # qc @ S without gamma^(i+1): the state read as if fresh


def chunked_reads_updated_state(q, k, v, chunk_size, gamma=1.0):
    """The chunk added to (S, z) before its queries read them, as the step does for its one token:
    each query then sees the chunk's later keys, and its earlier ones twice."""
    return _chunked(q, k, v, chunk_size, gamma, add_first=True)


def chunked_whole_matrix(q, k, v, chunk_size, gamma=1.0):
    return linear_attention(q, k, v, True, gamma)   # the (T, T) weights whatever chunk_size: right values, no chunks


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
    # One variant each: a step that decays only the state it returns (the sums added undecayed)
    # returns this oracle's first state, where decay-step-matches names it; and a z decayed in no
    # function gives, in each check, what a z forgotten in that function alone gives.
    "decay-on-current-token": [{"linear_attention_step": step_decays_after_adding}],
    "normaliser-not-decayed": [{"linear_attention": attention_normaliser_undecayed,
                                "linear_attention_step": step_normaliser_undecayed,
                                "linear_attention_chunked": chunked_normaliser_undecayed}],
    "chunk-state-not-decayed": [{"linear_attention_chunked": chunked_state_carried_undecayed},
                                {"linear_attention_chunked": chunked_state_read_undecayed}],
    "chunk-reads-updated-state": [{"linear_attention_chunked": chunked_reads_updated_state}],
    # Named by the recorded shapes, not by values: the (T, d, dv) states of a cumulative sum are
    # the style zoo's fast_transformers__not-chunked.
    "not-chunked": [{"linear_attention_chunked": chunked_whole_matrix}],
}
