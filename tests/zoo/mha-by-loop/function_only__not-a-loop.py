"""A function-only file whose `for` only reshapes q, k and v: every product then holds all heads."""
import math

import torch
import torch.nn.functional as F


def mha_by_loop(mha, x):
    B, T, C = x.shape
    hd = mha.head_dim
    q, k, v = mha.qkv(x).split(C, dim=-1)
    causal = torch.tril(torch.ones(T, T, device=x.device)).bool()
    q, k, v = (t.view(B, T, mha.n_head, hd).transpose(1, 2) for t in (q, k, v))
    scores = (q @ k.transpose(-2, -1) / math.sqrt(hd)).masked_fill(~causal, float("-inf"))
    return mha.proj((F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, C))
