"""vLLM's idiom (see vllm.py) with the softmax of the `(H, L)` scores taken over axis 0, the heads:
`attn.softmax(0)`, where each head's weights must be normalised over the L keys, axis -1
(softmax-wrong-dim)."""
import math

import torch


class BlockAllocator:
    def __init__(self, num_blocks, block_size):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.block_size = block_size
        self.ref = [0] * num_blocks
        self.free_ids = list(range(num_blocks))[::-1]   # popped from the end: block 0 first

    def allocate(self):
        if not self.free_ids:
            raise RuntimeError("no free blocks")
        b = self.free_ids.pop()
        self.ref[b] = 1
        return b

    def incref(self, block):
        self.ref[block] += 1

    def free(self, block):
        self.ref[block] -= 1
        if self.ref[block] == 0:
            self.free_ids.append(block)

    def refcount(self, block):
        return self.ref[block]

    def num_free(self):
        return len(self.free_ids)


class PagedKVCache:
    def __init__(self, num_blocks, block_size, n_kv_heads, head_dim, dtype=torch.float32, device=None):
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.bs = block_size
        shape = (num_blocks, block_size, n_kv_heads, head_dim)
        self.key_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.value_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.tables, self.lens = {}, {}

    def block_table(self, seq_id):
        return list(self.tables[seq_id])

    def seq_len(self, seq_id):
        return self.lens[seq_id]

    def _slot_mapping(self, table, start, n):
        pos = torch.arange(start, start + n)
        return (torch.tensor(table)[pos // self.bs] * self.bs + pos % self.bs).to(self.key_cache.device)

    def append(self, seq_id, k, v):
        table = list(self.tables.get(seq_id, []))
        n_ctx = self.lens.get(seq_id, 0)
        n = k.shape[0]
        need = math.ceil((n_ctx + n) / self.bs) - len(table)
        cow = n_ctx % self.bs != 0 and self.allocator.refcount(table[-1]) > 1
        if need + cow > self.allocator.num_free():
            raise RuntimeError("cache is full")
        if cow:
            src, dst = table[-1], self.allocator.allocate()
            self.key_cache[dst].copy_(self.key_cache[src])
            self.value_cache[dst].copy_(self.value_cache[src])
            self.allocator.free(src)
            table[-1] = dst
        table += [self.allocator.allocate() for _ in range(need)]
        slots = self._slot_mapping(table, n_ctx, n)
        self.key_cache.view(-1, *self.key_cache.shape[2:]).index_copy_(0, slots, k.to(self.key_cache.dtype))
        self.value_cache.view(-1, *self.value_cache.shape[2:]).index_copy_(0, slots, v.to(self.value_cache.dtype))
        self.tables[seq_id], self.lens[seq_id] = table, n_ctx + n

    def fork(self, src, dst):
        if dst in self.tables:
            raise ValueError("exists")
        for b in self.tables[src]:
            self.allocator.incref(b)
        self.tables[dst], self.lens[dst] = list(self.tables[src]), self.lens[src]

    def free(self, seq_id):
        for b in self.tables.pop(seq_id):
            self.allocator.free(b)
        del self.lens[seq_id]

    def gather(self, seq_id):
        slots = self._slot_mapping(self.tables[seq_id], 0, self.lens[seq_id])
        flat_k = self.key_cache.view(-1, *self.key_cache.shape[2:])
        flat_v = self.value_cache.view(-1, *self.value_cache.shape[2:])
        return flat_k[slots], flat_v[slots]


def paged_attention(q, cache, seq_ids):
    out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(q.shape[-1])
    for i, s in enumerate(seq_ids):
        k, v = cache.gather(s)
        group = q.shape[1] // k.shape[1]
        k = k.to(q.dtype).repeat_interleave(group, dim=1)   # (L, H, hd)
        v = v.to(q.dtype).repeat_interleave(group, dim=1)
        attn = torch.einsum("hd,lhd->hl", q[i], k) * scale
        out[i] = torch.einsum("hl,lhd->hd", attn.softmax(0), v)
    return out
