"""deque_dict.py's cache, whose append grows a sequence's list of blocks in place, and whose fork
builds the new record on the parent's list, ``Seq(parent.blocks, parent.length)``: two records,
one list of blocks."""
import math
from collections import deque
from dataclasses import dataclass, field

import torch


class BlockAllocator:
    def __init__(self, num_blocks, block_size):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be at least 1")
        self.free_q = deque(range(num_blocks))
        self.rc = {}

    def allocate(self):
        if not self.free_q:
            raise RuntimeError("no free block")
        block = self.free_q.popleft()
        self.rc[block] = 1
        return block

    def incref(self, block):
        self.rc[block] += 1

    def free(self, block):
        self.rc[block] -= 1
        if self.rc[block] == 0:
            del self.rc[block]
            self.free_q.append(block)

    def refcount(self, block):
        return self.rc.get(block, 0)

    def num_free(self):
        return len(self.free_q)


@dataclass
class Seq:
    blocks: list = field(default_factory=list)
    length: int = 0


class PagedKVCache:
    def __init__(self, num_blocks, block_size, n_kv_heads, head_dim, dtype=torch.float32, device=None):
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.block_size = block_size
        self.kv = torch.zeros(2, num_blocks, block_size, n_kv_heads, head_dim, dtype=dtype, device=device)
        self.seqs = {}

    def block_table(self, seq_id):
        return list(self.seqs[seq_id].blocks)

    def seq_len(self, seq_id):
        return self.seqs[seq_id].length

    def _where(self, blocks, start, stop):
        pos = torch.arange(start, stop, device=self.kv.device)
        table = torch.tensor(blocks, dtype=torch.long, device=self.kv.device)
        return table[torch.div(pos, self.block_size, rounding_mode="floor")], pos % self.block_size

    def append(self, seq_id, k, v):
        seq = self.seqs.get(seq_id, Seq())
        blocks = seq.blocks
        end = seq.length + k.shape[0]
        missing = -(-end // self.block_size) - len(blocks)
        partial = seq.length % self.block_size
        copy = bool(partial) and self.allocator.refcount(blocks[-1]) > 1
        if missing + copy > self.allocator.num_free():
            raise RuntimeError("pool full")
        if copy:
            new = self.allocator.allocate()
            self.kv[:, new] = self.kv[:, blocks[-1]]
            self.allocator.free(blocks[-1])
            blocks[-1] = new
        blocks.extend(self.allocator.allocate() for _ in range(missing))
        where = self._where(blocks, seq.length, end)
        self.kv[0][where] = k.to(self.kv.dtype)
        self.kv[1][where] = v.to(self.kv.dtype)
        self.seqs[seq_id] = Seq(blocks, end)

    def fork(self, src, dst):
        if dst in self.seqs:
            raise ValueError("sequence exists")
        parent = self.seqs[src]
        for block in parent.blocks:
            self.allocator.incref(block)
        self.seqs[dst] = Seq(parent.blocks, parent.length)

    def free(self, seq_id):
        for block in self.seqs.pop(seq_id).blocks:
            self.allocator.free(block)

    def gather(self, seq_id):
        seq = self.seqs[seq_id]
        where = self._where(seq.blocks, 0, seq.length)
        return self.kv[0][where], self.kv[1][where]


def paged_attention(q, cache, seq_ids):
    outs = []
    for i, seq_id in enumerate(seq_ids):
        k, v = cache.gather(seq_id)
        n_rep = q.shape[1] // k.shape[1]
        k = k.transpose(0, 1).repeat_interleave(n_rep, dim=0).to(q.dtype)   # (H, L, hd)
        v = v.transpose(0, 1).repeat_interleave(n_rep, dim=0).to(q.dtype)
        att = (q[i].unsqueeze(1) @ k.transpose(1, 2)) / math.sqrt(q.shape[-1])   # (H, 1, L)
        outs.append((att.softmax(dim=-1) @ v).squeeze(1))
    return torch.stack(outs)
