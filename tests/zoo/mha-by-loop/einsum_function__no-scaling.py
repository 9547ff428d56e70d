"""An einsum function-only file whose per-head scores `torch.einsum("bqd,bkd->bqk", q, k)` are never
multiplied by hd ** -0.5."""
import torch


def mha_by_loop(mha, x):
    B, T, C = x.shape
    hd = mha.head_dim
    w_q, w_k, w_v = mha.qkv.weight.split(C, dim=0)
    future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
    outs = []
    for h in range(mha.n_head):
        rows = slice(h * hd, (h + 1) * hd)
        q = torch.einsum("btc,dc->btd", x, w_q[rows])
        k = torch.einsum("btc,dc->btd", x, w_k[rows])
        v = torch.einsum("btc,dc->btd", x, w_v[rows])
        att = torch.einsum("bqd,bkd->bqk", q, k)
        att = att.masked_fill(future, float("-inf")).softmax(dim=-1)
        outs.append(torch.einsum("bqk,bkd->bqd", att, v))
    return torch.einsum("btc,oc->bto", torch.cat(outs, dim=-1), mha.proj.weight)
