"""Known grouped-query attention bugs, each the reference with exactly that mistake."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference.gqa import GroupedQueryAttention, repeat_kv


def repeat_kv_tiled(x, n_rep):
    return x.repeat(1, n_rep, 1, 1)   # [kv0, kv1, kv0, kv1, ...]: head j gets KV head j % Hkv


class KvRepeatTiled(GroupedQueryAttention):
    def forward(self, x, causal=True):
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        k, v = repeat_kv_tiled(k, self.n_rep), repeat_kv_tiled(v, self.n_rep)   # tiled, not interleaved
        att = (q @ k.transpose(-2, -1)) * self.scale
        if causal:
            allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~allowed, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.o_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class KvProjWrongSize(GroupedQueryAttention):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__(d_model, n_heads, n_kv_heads)
        # sized as in multi-head attention: one KV head per query head, nothing shared
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.n_kv_heads, self.n_rep = n_heads, 1


class ScaleByDModel(GroupedQueryAttention):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__(d_model, n_heads, n_kv_heads)
        self.scale = 1.0 / math.sqrt(d_model)   # the model width, not the head width


class NoScaling(GroupedQueryAttention):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__(d_model, n_heads, n_kv_heads)
        self.scale = 1.0   # the scores q·k left unscaled


class DoubleScale(GroupedQueryAttention):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__(d_model, n_heads, n_kv_heads)
        self.scale = 1.0 / self.head_dim   # 1/sqrt(head_dim) twice: q scaled, then the scores again


class SoftmaxWrongDim(GroupedQueryAttention):
    def forward(self, x, causal=True):
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        k, v = repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep)
        att = (q @ k.transpose(-2, -1)) * self.scale   # (B, H, T, T)
        if causal:
            allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~allowed, float("-inf"))
        y = F.softmax(att, dim=-2) @ v   # normalised over the queries, not the keys
        return self.o_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class NoCausalMask(GroupedQueryAttention):
    def forward(self, x, causal=True):
        return super().forward(x, causal=False)   # the flag is ignored: every query sees the future


class BannedApi(GroupedQueryAttention):
    def forward(self, x, causal=True):
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        return self.o_proj(y.transpose(1, 2).contiguous().view(B, T, C))


BUGS = {
    "kv-repeat-tiled": {"repeat_kv": repeat_kv_tiled, "GroupedQueryAttention": KvRepeatTiled},
    "kv-proj-wrong-size": {"GroupedQueryAttention": KvProjWrongSize},
    "scale-by-d-model": {"GroupedQueryAttention": ScaleByDModel},
    "no-scaling": {"GroupedQueryAttention": NoScaling},
    "double-scale": {"GroupedQueryAttention": DoubleScale},
    "softmax-wrong-dim": {"GroupedQueryAttention": SoftmaxWrongDim},
    "no-causal-mask": {"GroupedQueryAttention": NoCausalMask},
    "banned-api": {"GroupedQueryAttention": BannedApi},
}
