"""gpt-fast's idiom (pytorch-labs/gpt-fast, model.py): a (B, heads, max_seq_length, head_dim)
buffer written through `k_out[:, :, input_pos] = k_val`, the positions moved on before the write,
and a mask of positions compared; the heads repeated with `repeat_interleave` before the cache
update instead of after it, so the buffer holds n_heads heads per token (cache-stores-repeated-kv)."""
import torch
import torch.nn.functional as F
from torch import Tensor, nn


class KVCache(nn.Module):
    def __init__(self, max_seq_length=128):
        super().__init__()
        self.max_seq_length = max_seq_length
        self.k_cache = self.v_cache = None
        self.seq_len = 0

    def update(self, input_pos: Tensor, k_val: Tensor, v_val: Tensor):
        if self.k_cache is None:
            bsz, heads, _, head_dim = k_val.shape
            self.k_cache = k_val.new_zeros(bsz, heads, self.max_seq_length, head_dim)
            self.v_cache = v_val.new_zeros(bsz, heads, self.max_seq_length, head_dim)
        k_out, v_out = self.k_cache, self.v_cache
        k_out[:, :, input_pos] = k_val
        v_out[:, :, input_pos] = v_val
        return k_out[:, :, :self.seq_len], v_out[:, :, :self.seq_len]

    def append(self, k, v):
        input_pos = torch.arange(self.seq_len, self.seq_len + k.shape[2], device=k.device)
        self.seq_len += k.shape[2]
        return self.update(input_pos, k, v)

    def reset(self):
        self.seq_len = 0

    def __len__(self):
        return self.seq_len


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        assert d_model % n_heads == 0, f"dim {d_model} must be divisible by n_head {n_heads}"
        if n_heads % n_kv_heads:
            raise ValueError(f"n_head {n_heads} must be a multiple of n_local_heads {n_kv_heads}")
        self.n_head, self.n_local_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: Tensor, cache=None, start_pos=0) -> Tensor:
        held = 0 if cache is None else len(cache)
        if start_pos != held:
            raise ValueError(f"start_pos {start_pos} does not match the {held} cached positions")
        bsz, seqlen, _ = x.shape
        q = self.q_proj(x).view(bsz, seqlen, self.n_head, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(bsz, seqlen, self.n_local_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(bsz, seqlen, self.n_local_heads, self.head_dim).transpose(1, 2)
        k = k.repeat_interleave(self.n_head // self.n_local_heads, dim=1)
        v = v.repeat_interleave(self.n_head // self.n_local_heads, dim=1)
        if cache is not None:
            k, v = cache.append(k, v)
        input_pos = torch.arange(start_pos, start_pos + seqlen, device=x.device)
        mask = torch.arange(k.shape[2], device=x.device)[None, :] <= input_pos[:, None]
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.head_dim ** -0.5
        scores = scores.masked_fill(~mask, float("-inf"))
        y = torch.matmul(F.softmax(scores, dim=-1), v)
        return self.o_proj(y.transpose(1, 2).contiguous().view(bsz, seqlen, -1))
