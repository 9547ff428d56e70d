"""Known mha-by-loop bugs, each a complete mha_by_loop with exactly that mistake."""
import math

import torch
import torch.nn.functional as F


def mha_by_loop_scale_by_d_model(mha, x):
    B, T, C = x.shape
    hd = mha.head_dim
    W_q, W_k, W_v = mha.qkv.weight.split(C, dim=0)
    q, k, v = x @ W_q.T, x @ W_k.T, x @ W_v.T
    allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    heads = []
    for i in range(mha.n_head):
        h = slice(i * hd, (i + 1) * hd)
        att = (q[..., h] @ k[..., h].transpose(-2, -1)) / math.sqrt(C)   # the model width, not the head's
        att = att.masked_fill(~allowed, float("-inf"))
        heads.append(F.softmax(att, dim=-1) @ v[..., h])
    return mha.proj(torch.cat(heads, dim=-1))


def mha_by_loop_no_scaling(mha, x):
    B, T, C = x.shape
    hd = mha.head_dim
    W_q, W_k, W_v = mha.qkv.weight.split(C, dim=0)
    q, k, v = x @ W_q.T, x @ W_k.T, x @ W_v.T
    allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    heads = []
    for i in range(mha.n_head):
        h = slice(i * hd, (i + 1) * hd)
        att = q[..., h] @ k[..., h].transpose(-2, -1)   # the scores left unscaled
        att = att.masked_fill(~allowed, float("-inf"))
        heads.append(F.softmax(att, dim=-1) @ v[..., h])
    return mha.proj(torch.cat(heads, dim=-1))


def mha_by_loop_double_scale(mha, x):
    B, T, C = x.shape
    hd = mha.head_dim
    W_q, W_k, W_v = mha.qkv.weight.split(C, dim=0)
    q, k, v = x @ W_q.T, x @ W_k.T, x @ W_v.T
    allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    heads = []
    for i in range(mha.n_head):
        h = slice(i * hd, (i + 1) * hd)
        att = (q[..., h] @ k[..., h].transpose(-2, -1)) / hd   # 1/sqrt(hd) twice: divided by hd
        att = att.masked_fill(~allowed, float("-inf"))
        heads.append(F.softmax(att, dim=-1) @ v[..., h])
    return mha.proj(torch.cat(heads, dim=-1))


def mha_by_loop_softmax_wrong_dim(mha, x):
    B, T, C = x.shape
    hd = mha.head_dim
    W_q, W_k, W_v = mha.qkv.weight.split(C, dim=0)
    q, k, v = x @ W_q.T, x @ W_k.T, x @ W_v.T
    allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    heads = []
    for i in range(mha.n_head):
        h = slice(i * hd, (i + 1) * hd)
        att = (q[..., h] @ k[..., h].transpose(-2, -1)) / math.sqrt(hd)   # (B, T, T)
        att = att.masked_fill(~allowed, float("-inf"))
        heads.append(F.softmax(att, dim=-2) @ v[..., h])   # normalised over the queries, not the keys
    return mha.proj(torch.cat(heads, dim=-1))


def mha_by_loop_interleaved(mha, x):
    B, T, C = x.shape
    hd = mha.head_dim
    allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    heads = []
    for i in range(mha.n_head):
        # reads the rows as per-head blocks [q_h; k_h; v_h]; they are stacked [W_q; W_k; W_v]
        W_q, W_k, W_v = mha.qkv.weight[3 * i * hd:3 * (i + 1) * hd].split(hd, dim=0)
        q, k, v = x @ W_q.T, x @ W_k.T, x @ W_v.T
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(~allowed, float("-inf"))
        heads.append(F.softmax(att, dim=-1) @ v)
    return mha.proj(torch.cat(heads, dim=-1))


def mha_by_loop_no_transpose(mha, x):
    B, T, C = x.shape
    hd = mha.head_dim
    W_q, W_k, W_v = mha.qkv.weight.split(C, dim=0)
    q, k, v = x @ W_q, x @ W_k, x @ W_v   # square blocks, so the shapes work: nn.Linear computes x @ W.T
    allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    heads = []
    for i in range(mha.n_head):
        h = slice(i * hd, (i + 1) * hd)
        att = (q[..., h] @ k[..., h].transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(~allowed, float("-inf"))
        heads.append(F.softmax(att, dim=-1) @ v[..., h])
    return mha.proj(torch.cat(heads, dim=-1))


def mha_by_loop_no_out_proj(mha, x):
    B, T, C = x.shape
    hd = mha.head_dim
    W_q, W_k, W_v = mha.qkv.weight.split(C, dim=0)
    q, k, v = x @ W_q.T, x @ W_k.T, x @ W_v.T
    allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    heads = []
    for i in range(mha.n_head):
        h = slice(i * hd, (i + 1) * hd)
        att = (q[..., h] @ k[..., h].transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(~allowed, float("-inf"))
        heads.append(F.softmax(att, dim=-1) @ v[..., h])
    return torch.cat(heads, dim=-1)   # the heads concatenated, never mixed by proj


def mha_by_loop_no_mask(mha, x):
    B, T, C = x.shape
    hd = mha.head_dim
    W_q, W_k, W_v = mha.qkv.weight.split(C, dim=0)
    q, k, v = x @ W_q.T, x @ W_k.T, x @ W_v.T
    heads = []
    for i in range(mha.n_head):
        h = slice(i * hd, (i + 1) * hd)
        att = (q[..., h] @ k[..., h].transpose(-2, -1)) / math.sqrt(hd)   # every key visible, the future too
        heads.append(F.softmax(att, dim=-1) @ v[..., h])
    return mha.proj(torch.cat(heads, dim=-1))


def mha_by_loop_all_heads_at_once(mha, x):
    B, T, C = x.shape
    # the `for` only walks q, k and v: every matmul below holds all heads, (B, H, T, hd)
    q, k, v = (t.view(B, T, mha.n_head, mha.head_dim).transpose(1, 2) for t in mha.qkv(x).split(C, dim=2))
    allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    att = (q @ k.transpose(-2, -1)) / math.sqrt(mha.head_dim)
    att = att.masked_fill(~allowed, float("-inf"))
    y = F.softmax(att, dim=-1) @ v
    return mha.proj(y.transpose(1, 2).reshape(B, T, C))


BUGS = {
    "scale-by-d-model": {"mha_by_loop": mha_by_loop_scale_by_d_model},
    "no-scaling": {"mha_by_loop": mha_by_loop_no_scaling},
    "double-scale": {"mha_by_loop": mha_by_loop_double_scale},
    "softmax-wrong-dim": {"mha_by_loop": mha_by_loop_softmax_wrong_dim},
    "qkv-layout-interleaved": {"mha_by_loop": mha_by_loop_interleaved},
    "missing-weight-transpose": {"mha_by_loop": mha_by_loop_no_transpose},
    "missing-out-proj": {"mha_by_loop": mha_by_loop_no_out_proj},
    "no-causal-mask": {"mha_by_loop": mha_by_loop_no_mask},
    "not-a-loop": {"mha_by_loop": mha_by_loop_all_heads_at_once},
}
