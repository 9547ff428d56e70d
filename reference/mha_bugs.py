"""Known multi-head attention bugs, each the reference with exactly that mistake."""
import math

import torch.nn.functional as F

from reference.mha import MultiHeadSelfAttention


class ScaleByDModel(MultiHeadSelfAttention):
    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__(d_model, n_heads, dropout)
        self.scale = 1.0 / math.sqrt(d_model)   # the model width, not the head width


class NoScaling(MultiHeadSelfAttention):
    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__(d_model, n_heads, dropout)
        self.scale = 1.0


class DoubleScale(MultiHeadSelfAttention):
    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__(d_model, n_heads, dropout)
        self.scale = 1.0 / self.head_dim   # 1/sqrt(head_dim) applied twice


class ViewWithoutTranspose(MultiHeadSelfAttention):
    def split_heads(self, t):
        B, T, C = t.shape
        return t.reshape(B, self.n_heads, T, self.head_dim)   # reinterprets memory: heads mix tokens


class MergeWithoutTranspose(MultiHeadSelfAttention):
    def merge_heads(self, y):
        B, H, T, hd = y.shape
        return y.reshape(B, T, H * hd)   # (B, H, T, hd) memory read as (B, T, C)


class SoftmaxWrongDim(MultiHeadSelfAttention):
    def attend(self, q, k, v, causal):
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * self.scale
        if causal:
            att = att.masked_fill(~self.causal_mask(T, q.device), float("-inf"))
        att = F.softmax(att, dim=-2)   # normalises over the queries, not the keys
        att = self.attn_dropout(att)
        return att @ v, att


class MaskInverted(MultiHeadSelfAttention):
    def causal_mask(self, T, device=None):
        return super().causal_mask(T, device).logical_not()   # nn.MultiheadAttention's convention


class MaskExcludesDiagonal(MultiHeadSelfAttention):
    def causal_mask(self, T, device=None):
        return super().causal_mask(T, device).tril(-1)   # a token may not attend to itself


class MissingOutProj(MultiHeadSelfAttention):
    def forward(self, x, causal=False):
        q, k, v = self.qkv_proj(x).split(self.d_model, dim=-1)
        y, att = self.attend(self.split_heads(q), self.split_heads(k), self.split_heads(v), causal)
        return self.merge_heads(y), att   # out_proj never applied


class QkvSplitOrder(MultiHeadSelfAttention):
    def forward(self, x, causal=False):
        k, q, v = self.qkv_proj(x).split(self.d_model, dim=-1)   # the rows are [W_q; W_k; W_v]
        y, att = self.attend(self.split_heads(q), self.split_heads(k), self.split_heads(v), causal)
        return self.out_proj(self.merge_heads(y)), att


class DropoutInEval(MultiHeadSelfAttention):
    def attend(self, q, k, v, causal):
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * self.scale
        if causal:
            att = att.masked_fill(~self.causal_mask(T, q.device), float("-inf"))
        att = F.softmax(att, dim=-1)
        att = F.dropout(att, self.attn_dropout.p)   # F.dropout's training=True default: drops in eval too
        return att @ v, att


class WeightsBeforeDropout(MultiHeadSelfAttention):
    def attend(self, q, k, v, causal):
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * self.scale
        if causal:
            att = att.masked_fill(~self.causal_mask(T, q.device), float("-inf"))
        att = F.softmax(att, dim=-1)
        return self.attn_dropout(att) @ v, att   # d2l keeps the weights before dropout to return


class BannedApi(MultiHeadSelfAttention):
    def attend(self, q, k, v, causal):
        _, att = super().attend(q, k, v, causal)   # the weights by hand, the output from SDPA
        p = self.attn_dropout.p if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal), att


BUGS = {
    "scale-by-d-model": {"MultiHeadSelfAttention": ScaleByDModel},
    "no-scaling": {"MultiHeadSelfAttention": NoScaling},
    "double-scale": {"MultiHeadSelfAttention": DoubleScale},
    "view-without-transpose": {"MultiHeadSelfAttention": ViewWithoutTranspose},
    "merge-without-transpose": {"MultiHeadSelfAttention": MergeWithoutTranspose},
    "softmax-wrong-dim": {"MultiHeadSelfAttention": SoftmaxWrongDim},
    "mask-inverted": {"MultiHeadSelfAttention": MaskInverted},
    "mask-excludes-diagonal": {"MultiHeadSelfAttention": MaskExcludesDiagonal},
    "missing-out-proj": {"MultiHeadSelfAttention": MissingOutProj},
    "qkv-split-order": {"MultiHeadSelfAttention": QkvSplitOrder},
    "dropout-in-eval": {"MultiHeadSelfAttention": DropoutInEval},
    "weights-before-dropout": {"MultiHeadSelfAttention": WeightsBeforeDropout},
    "banned-api": {"MultiHeadSelfAttention": BannedApi},
}
