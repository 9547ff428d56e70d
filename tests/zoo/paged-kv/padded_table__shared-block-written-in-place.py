"""A tensor block table padded with -1, without copy on write: after a fork, both sequences
write their next tokens into the partial last block they share."""
import math

import torch


class BlockAllocator:
    def __init__(self, num_blocks, block_size):
        if min(num_blocks, block_size) < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.refs = torch.zeros(num_blocks, dtype=torch.long)

    def allocate(self):
        free = (self.refs == 0).nonzero()
        if len(free) == 0:
            raise RuntimeError("all blocks in use")
        block = int(free[0])
        self.refs[block] = 1
        return block

    def incref(self, block):
        self.refs[block] += 1

    def free(self, block):
        self.refs[block] -= 1   # free again as soon as the count is 0

    def refcount(self, block):
        return int(self.refs[block])

    def num_free(self):
        return int((self.refs == 0).sum())


class PagedKVCache:
    def __init__(self, num_blocks, block_size, n_kv_heads, head_dim, dtype=torch.float32, device=None):
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.b = block_size
        self.k_cache = torch.zeros(num_blocks, block_size, n_kv_heads, head_dim, dtype=dtype, device=device)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.rows = {}   # seq_id -> (num_blocks,) long, -1 past the sequence's blocks
        self.lens = {}

    def _row(self, seq_id):
        if seq_id not in self.rows:
            return torch.full((self.k_cache.shape[0],), -1, dtype=torch.long), 0
        return self.rows[seq_id].clone(), self.lens[seq_id]

    def block_table(self, seq_id):
        row = self.rows[seq_id]
        return row[row >= 0].tolist()

    def seq_len(self, seq_id):
        return self.lens[seq_id]

    def append(self, seq_id, k, v):
        row, n = self._row(seq_id)
        t = k.shape[0]
        held = int((row >= 0).sum())
        need = math.ceil((n + t) / self.b) - held
        if need > self.allocator.num_free():
            raise RuntimeError("pool exhausted")
        for i in range(need):
            row[held + i] = self.allocator.allocate()
        pos = torch.arange(n, n + t)
        idx = row[pos // self.b].to(self.k_cache.device)
        slot = (pos % self.b).to(self.k_cache.device)
        self.k_cache.index_put_((idx, slot), k.to(self.k_cache.dtype))
        self.v_cache.index_put_((idx, slot), v.to(self.v_cache.dtype))
        self.rows[seq_id], self.lens[seq_id] = row, n + t

    def fork(self, src, dst):
        if dst in self.rows:
            raise ValueError(f"{dst} exists")
        row = self.rows[src]
        for block in row[row >= 0].tolist():
            self.allocator.incref(block)
        self.rows[dst], self.lens[dst] = row.clone(), self.lens[src]

    def free(self, seq_id):
        row = self.rows.pop(seq_id)
        for block in row[row >= 0].tolist():
            self.allocator.free(block)
        del self.lens[seq_id]

    def gather(self, seq_id):
        pos = torch.arange(self.lens[seq_id])
        idx = self.rows[seq_id][pos // self.b].to(self.k_cache.device)
        slot = (pos % self.b).to(self.k_cache.device)
        return self.k_cache[idx, slot], self.v_cache[idx, slot]


def paged_attention(q, cache, seq_ids):
    B, H, D = q.shape
    out = []
    for b, s in enumerate(seq_ids):
        k, v = cache.gather(s)   # (L, Hkv, D)
        Hkv = k.shape[1]
        qg = q[b].view(Hkv, H // Hkv, D)   # query heads grouped by the KV head they read
        scores = torch.einsum("kgd,lkd->kgl", qg, k.to(q.dtype)) / math.sqrt(D)
        out.append(torch.einsum("kgl,lkd->kgd", scores.softmax(dim=-1), v.to(q.dtype)).reshape(H, D))
    return torch.stack(out)
