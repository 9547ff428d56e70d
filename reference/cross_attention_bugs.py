"""Known cross-attention bugs, each the reference with exactly that mistake."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference.cross_attention import MultiHeadAttention


class KvFromQuery(MultiHeadAttention):
    def forward(self, query, key, value, key_padding_mask=None, attn_mask=None):
        q = self.split_heads(self.q_proj(query))
        k = self.split_heads(self.k_proj(query))   # self-attention habit: keys and values from the
        v = self.split_heads(self.v_proj(query))   # decoder itself, the encoder's output never read
        att = (q @ k.transpose(-2, -1)) * self.scale   # (B, H, Tq, Tq)
        allowed = self.combine_masks(key_padding_mask, attn_mask)
        if allowed is not None:
            att = att.masked_fill(~allowed, float("-inf"))
        att = F.softmax(att, dim=-1)
        return self.out_proj(self.merge_heads(att @ v)), att


class PaddingMaskInverted(MultiHeadAttention):
    def combine_masks(self, key_padding_mask, attn_mask):
        # nn.MultiheadAttention's convention (True = ignore this key) read as this kit's
        flipped = None if key_padding_mask is None else ~key_padding_mask
        return super().combine_masks(flipped, attn_mask)


class PaddingOnQueries(MultiHeadAttention):
    def combine_masks(self, key_padding_mask, attn_mask):
        allowed = super().combine_masks(None, attn_mask)
        if key_padding_mask is None:
            return allowed
        rows = key_padding_mask[:, None, :, None]   # (B, 1, Tk, 1): along the queries; broadcasts only if Tq == Tk
        return rows if allowed is None else allowed & rows


class AttnMaskInverted(MultiHeadAttention):
    def combine_masks(self, key_padding_mask, attn_mask):
        return super().combine_masks(key_padding_mask, None if attn_mask is None else ~attn_mask)


class CausalInCross(MultiHeadAttention):
    bottom_right = False   # the decoder's square mask as most people write it: tril(), top-left

    def forward(self, query, key, value, key_padding_mask=None, attn_mask=None):
        q = self.split_heads(self.q_proj(query))
        k = self.split_heads(self.k_proj(key))
        v = self.split_heads(self.v_proj(value))
        att = (q @ k.transpose(-2, -1)) * self.scale
        Tq, Tk = att.shape[-2:]
        # a decoder's causal mask added to every call, though the keys are the encoder's tokens
        causal = torch.ones(Tq, Tk, dtype=torch.bool, device=att.device).tril(Tk - Tq if self.bottom_right else 0)
        allowed = self.combine_masks(key_padding_mask, attn_mask)
        allowed = causal if allowed is None else allowed & causal
        att = F.softmax(att.masked_fill(~allowed, float("-inf")), dim=-1)
        return self.out_proj(self.merge_heads(att @ v)), att


class CausalInCrossBottomRight(CausalInCross):
    bottom_right = True   # aligned as a KV cache would need it: tril(Tk - Tq)


class KdimIgnored(MultiHeadAttention):
    def __init__(self, d_model, n_heads, kdim=None, vdim=None):
        super().__init__(d_model, n_heads, kdim, vdim)
        self.k_proj = nn.Linear(d_model, d_model)   # sized as in self-attention: key and value
        self.v_proj = nn.Linear(d_model, d_model)   # of any other width no longer fit


class VdimIgnored(MultiHeadAttention):
    def __init__(self, d_model, n_heads, kdim=None, vdim=None):
        super().__init__(d_model, n_heads, kdim, vdim)
        self.v_proj = nn.Linear(d_model if kdim is None else kdim, d_model)   # kdim taken for both


class ScaleByDModel(MultiHeadAttention):
    def __init__(self, d_model, n_heads, kdim=None, vdim=None):
        super().__init__(d_model, n_heads, kdim, vdim)
        self.scale = 1.0 / math.sqrt(d_model)   # the model width, not the head width


class NoScaling(MultiHeadAttention):
    def __init__(self, d_model, n_heads, kdim=None, vdim=None):
        super().__init__(d_model, n_heads, kdim, vdim)
        self.scale = 1.0   # the scores q·k left unscaled


class DoubleScale(MultiHeadAttention):
    def __init__(self, d_model, n_heads, kdim=None, vdim=None):
        super().__init__(d_model, n_heads, kdim, vdim)
        self.scale = 1.0 / self.head_dim   # 1/sqrt(head_dim) twice: q scaled, then the scores again


class SoftmaxWrongDim(MultiHeadAttention):
    def forward(self, query, key, value, key_padding_mask=None, attn_mask=None):
        q = self.split_heads(self.q_proj(query))
        k = self.split_heads(self.k_proj(key))
        v = self.split_heads(self.v_proj(value))
        att = (q @ k.transpose(-2, -1)) * self.scale   # (B, H, Tq, Tk)
        allowed = self.combine_masks(key_padding_mask, attn_mask)
        if allowed is not None:
            att = att.masked_fill(~allowed, float("-inf"))
        # normalised over the queries, not the keys: a padded key's all -inf column comes out NaN
        att = F.softmax(att, dim=-2)
        return self.out_proj(self.merge_heads(att @ v)), att


class HeadsAveraged(MultiHeadAttention):
    keepdim = False   # nn.MultiheadAttention's default shape: (B, Tq, Tk)

    def forward(self, query, key, value, key_padding_mask=None, attn_mask=None):
        out, att = super().forward(query, key, value, key_padding_mask, attn_mask)
        # nn.MultiheadAttention's default, average_attn_weights=True: one map for all the heads
        return out, att.mean(dim=1, keepdim=self.keepdim)   # (B, Tq, Tk) or (B, 1, Tq, Tk)


class HeadsAveragedKeepdim(HeadsAveraged):
    keepdim = True   # the head axis kept, of size 1: (B, 1, Tq, Tk)


class BannedApi(MultiHeadAttention):
    def forward(self, query, key, value, key_padding_mask=None, attn_mask=None):
        _, att = super().forward(query, key, value, key_padding_mask, attn_mask)   # the weights by hand
        q = self.split_heads(self.q_proj(query))
        k = self.split_heads(self.k_proj(key))
        v = self.split_heads(self.v_proj(value))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.combine_masks(key_padding_mask, attn_mask))
        return self.out_proj(self.merge_heads(y)), att


BUGS = {
    "kv-from-query": {"MultiHeadAttention": KvFromQuery},
    "padding-mask-inverted": {"MultiHeadAttention": PaddingMaskInverted},
    "padding-on-queries": {"MultiHeadAttention": PaddingOnQueries},
    "causal-in-cross": [{"MultiHeadAttention": CausalInCross}, {"MultiHeadAttention": CausalInCrossBottomRight}],
    "kdim-ignored": [{"MultiHeadAttention": KdimIgnored}, {"MultiHeadAttention": VdimIgnored}],
    "attn-mask-inverted": {"MultiHeadAttention": AttnMaskInverted},
    "scale-by-d-model": {"MultiHeadAttention": ScaleByDModel},
    "no-scaling": {"MultiHeadAttention": NoScaling},
    "double-scale": {"MultiHeadAttention": DoubleScale},
    "softmax-wrong-dim": {"MultiHeadAttention": SoftmaxWrongDim},
    "heads-averaged": [{"MultiHeadAttention": HeadsAveraged}, {"MultiHeadAttention": HeadsAveragedKeepdim}],
    "banned-api": {"MultiHeadAttention": BannedApi},
}
