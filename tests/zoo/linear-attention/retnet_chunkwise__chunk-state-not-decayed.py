"""RetNet's chunkwise form with the cross-chunk decay left out of the loop: kv_state + kv[:, :, i],
so the state of the earlier chunks never fades by gamma^C as a chunk passes. Right with gamma = 1
and with a single chunk."""
import math

import torch
import torch.nn.functional as F


def elu_feature_map(x):
    return F.elu(x) + 1


def with_ones(v):
    return torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)   # (..., dv + 1): the last column sums the weights


def decay_mask(n, gamma, like):
    index = torch.arange(n).to(like)
    mask = torch.tril(torch.ones(n, n)).to(like)
    mask = torch.masked_fill(index[:, None] - index[None, :], ~mask.bool(), float("inf"))
    return torch.nan_to_num(torch.exp(mask * math.log(gamma)))   # exp(-inf) = 0 above; 0 · inf = nan -> 0 at gamma 1


def linear_attention(q, k, v, causal=True, gamma=1.0):
    if not causal and gamma != 1:
        raise ValueError("retention decays along the sequence: causal=False takes gamma = 1")
    qr, kr = elu_feature_map(q), elu_feature_map(k)
    qk_mat = qr @ kr.transpose(-1, -2)
    if causal:
        qk_mat = qk_mat * decay_mask(q.size(2), gamma, q)
    output = qk_mat @ with_ones(v)
    return output[..., :-1] / output[..., -1:]


def linear_attention_step(q, k, v, state=None, gamma=1.0):
    qr, kr = elu_feature_map(q), elu_feature_map(k)
    kv = kr.unsqueeze(-1) * with_ones(v).unsqueeze(-2)   # (B, H, d, dv + 1)
    if state is not None:
        kv = kv + gamma * torch.cat([state[0], state[1].unsqueeze(-1)], dim=-1)
    output = (qr.unsqueeze(-2) @ kv).squeeze(-2)
    return output[..., :-1] / output[..., -1:], (kv[..., :-1], kv[..., -1])


def linear_attention_chunked(q, k, v, chunk_size, gamma=1.0):
    bsz, num_heads, tgt_len, _ = q.shape
    qr, kr, vr = elu_feature_map(q), elu_feature_map(k), with_ones(v)
    # Padded keys are zero features after every real query: the mask hides them, and they add nothing.
    padding_len = -tgt_len % chunk_size
    qr, kr, vr = (F.pad(x, (0, 0, 0, padding_len)) for x in (qr, kr, vr))
    num_chunks = qr.size(2) // chunk_size
    qr, kr, vr = (x.view(bsz, num_heads, num_chunks, chunk_size, x.size(-1)) for x in (qr, kr, vr))

    block_index = torch.arange(chunk_size).to(q)
    mask = decay_mask(chunk_size, gamma, q)
    cross_decay = gamma ** chunk_size
    query_inner_decay = (gamma ** (block_index + 1))[:, None]
    value_inner_decay = (gamma ** (chunk_size - 1 - block_index))[:, None]

    qk_mat = (qr @ kr.transpose(-1, -2)) * mask   # (B, H, n, C, C)
    inner_output = qk_mat @ vr
    kv = kr.transpose(-1, -2) @ (vr * value_inner_decay)   # (B, H, n, d, dv + 1): each chunk reduced
    kv_recurrent = []
    kv_state = torch.zeros_like(kv[:, :, 0])
    for i in range(num_chunks):
        kv_recurrent.append(kv_state)
        kv_state = kv_state + kv[:, :, i]
    kv_recurrent = torch.stack(kv_recurrent, dim=2)   # the state before each chunk
    cross_output = (qr * query_inner_decay) @ kv_recurrent
    output = (inner_output + cross_output).reshape(bsz, num_heads, -1, vr.size(-1))[:, :, :tgt_len]
    return output[..., :-1] / output[..., -1:]
