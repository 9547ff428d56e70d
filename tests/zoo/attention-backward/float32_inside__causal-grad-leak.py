"""Llama-style float32 backward whose dscores uses a softmax recomputed without the causal bias:
dv is masked, but gradient flows into dq and dk through pairs the mask hides."""
import math

import torch
import torch.nn.functional as F


def softmax_backward(p, dp):
    p32, dp32 = p.float(), dp.float()
    return (p32 * (dp32 - (p32 * dp32).sum(dim=-1, keepdim=True))).type_as(p)


def attention_backward(q, k, v, do, scale=None, causal=False):
    xq, xk, xv, dout = q.float(), k.float(), v.float(), do.float()
    head_dim = q.shape[-1]
    softmax_scale = scale if scale is not None else 1 / math.sqrt(head_dim)
    scores = torch.matmul(xq, xk.transpose(2, 3)) * softmax_scale
    if causal:
        seqlen, cache_len = q.shape[-2], k.shape[-2] - q.shape[-2]
        allowed = torch.ones(seqlen, seqlen + cache_len, dtype=torch.bool, device=q.device).tril(cache_len)
        bias = torch.zeros(allowed.shape, device=q.device).masked_fill(~allowed, torch.finfo(torch.float32).min)
        scores = scores + bias
        probs = F.softmax(scores, dim=-1) * allowed.any(dim=-1, keepdim=True)
    else:
        probs = F.softmax(scores, dim=-1)
    dv = torch.matmul(probs.transpose(2, 3), dout)
    dprobs = torch.matmul(dout, xv.transpose(2, 3))
    dscores = softmax_backward(F.softmax(torch.matmul(xq, xk.transpose(2, 3)) * softmax_scale, dim=-1), dprobs)
    dq = torch.matmul(dscores, xk) * softmax_scale
    dk = torch.matmul(dscores.transpose(2, 3), xq) * softmax_scale
    return dq.type_as(q), dk.type_as(k), dv.type_as(v)
