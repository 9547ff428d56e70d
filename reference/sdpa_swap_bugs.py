"""Known SDPA-swap bugs, each the reference with exactly that mistake."""
import math

import torch
import torch.nn.functional as F

from reference.sdpa_swap import CausalSelfAttention


class DoubleScale(CausalSelfAttention):
    def flash_attention(self, q, k, v):
        q = q * (1.0 / math.sqrt(self.head_dim))   # kept from the manual path: SDPA scales again
        return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              dropout_p=self.dropout if self.training else 0.0)


class NoScaling(CausalSelfAttention):
    def manual_attention(self, q, k, v):
        T = q.size(-2)
        att = q @ k.transpose(-2, -1)   # never multiplied by 1/sqrt(head_dim): only SDPA scales
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        return self.attn_dropout(F.softmax(att, dim=-1)) @ v


class SoftmaxWrongDim(CausalSelfAttention):
    def manual_attention(self, q, k, v):
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        return self.attn_dropout(F.softmax(att, dim=-2)) @ v   # over the queries: each key's column sums to 1


class DropoutInEval(CausalSelfAttention):
    def flash_attention(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout)   # in eval too


class SdpaWithExplicitMask(CausalSelfAttention):
    def flash_attention(self, q, k, v):
        T = q.size(-2)
        # the right values, but a mask tensor rules out the FlashAttention kernel
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask[:T, :T],
                                              dropout_p=self.dropout if self.training else 0.0)


class SdpaNotUsed(CausalSelfAttention):
    def flash_attention(self, q, k, v):
        return self.manual_attention(q, k, v)   # flash=True still materialises the (T, T) scores


class PathsDisagree(CausalSelfAttention):
    def manual_attention(self, q, k, v):
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        att = self.attn_dropout(F.softmax(att, dim=-1))   # no causal mask: the future leaks in
        return att @ v


class MaskNotBuffer(CausalSelfAttention):
    def __init__(self, n_embd, n_head, block_size, dropout=0.0, flash=True):
        super().__init__(n_embd, n_head, block_size, dropout, flash)
        del self.mask
        self.mask = torch.ones(block_size, block_size, dtype=torch.bool).tril()   # .to() leaves it behind


class ManualPathNoDropout(CausalSelfAttention):
    def manual_attention(self, q, k, v):
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        return F.softmax(att, dim=-1) @ v   # attn_dropout forgotten: SDPA's dropout_p has no twin here


class ManualPathNoDropoutAtAll(CausalSelfAttention):
    def forward(self, x):
        if self.flash:
            return super().forward(x)
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)   # the manual path was written for inference: neither dropout


BUGS = {
    "double-scale": {"CausalSelfAttention": DoubleScale},
    "no-scaling": {"CausalSelfAttention": NoScaling},
    "softmax-wrong-dim": {"CausalSelfAttention": SoftmaxWrongDim},
    "dropout-in-eval": {"CausalSelfAttention": DropoutInEval},
    "sdpa-with-explicit-mask": {"CausalSelfAttention": SdpaWithExplicitMask},
    "sdpa-not-used": {"CausalSelfAttention": SdpaNotUsed},
    "paths-disagree": {"CausalSelfAttention": PathsDisagree},
    "mask-not-buffer": {"CausalSelfAttention": MaskNotBuffer},
    "manual-path-no-dropout": [{"CausalSelfAttention": ManualPathNoDropout},
                               {"CausalSelfAttention": ManualPathNoDropoutAtAll}],
}
