"""Hand-rolled lists and loops (see python_lists.py) with each head's scores left unscaled:
`torch.softmax(kh @ q[b, h], dim=0)`, never divided by sqrt(head_dim) (no-scaling)."""
import torch


class BlockAllocator:
    def __init__(self, num_blocks, block_size):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("bad sizes")
        self.free_list = list(range(num_blocks))
        self.counts = [0] * num_blocks

    def allocate(self):
        if len(self.free_list) == 0:
            raise RuntimeError("out of memory")
        block = self.free_list.pop(0)
        self.counts[block] = 1
        return block

    def incref(self, block):
        self.counts[block] = self.counts[block] + 1

    def free(self, block):
        self.counts[block] = self.counts[block] - 1
        if self.counts[block] == 0:
            self.free_list.append(block)

    def refcount(self, block):
        return self.counts[block]

    def num_free(self):
        return len(self.free_list)


class PagedKVCache:
    def __init__(self, num_blocks, block_size, n_kv_heads, head_dim, dtype=torch.float32, device=None):
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.block_size = block_size
        self.k_pool = torch.zeros(num_blocks, block_size, n_kv_heads, head_dim, dtype=dtype, device=device)
        self.v_pool = torch.zeros(num_blocks, block_size, n_kv_heads, head_dim, dtype=dtype, device=device)
        self.tables = {}
        self.lengths = {}

    def block_table(self, seq_id):
        return self.tables[seq_id][:]

    def seq_len(self, seq_id):
        return self.lengths[seq_id]

    def blocks_for(self, n_tokens):
        return (n_tokens + self.block_size - 1) // self.block_size

    def append(self, seq_id, k, v):
        table = self.tables.get(seq_id, [])[:]
        length = self.lengths.get(seq_id, 0)
        new = self.blocks_for(length + k.shape[0]) - len(table)
        copy = length % self.block_size > 0 and self.allocator.refcount(table[-1]) > 1
        if new + int(copy) > self.allocator.num_free():
            raise RuntimeError("not enough free blocks")
        if copy:
            fresh = self.allocator.allocate()
            self.k_pool[fresh] = self.k_pool[table[-1]]
            self.v_pool[fresh] = self.v_pool[table[-1]]
            self.allocator.free(table[-1])
            table[-1] = fresh
        for _ in range(new):
            table.append(self.allocator.allocate())
        for i in range(k.shape[0]):
            p = length + i
            self.k_pool[table[p // self.block_size], p % self.block_size] = k[i]
            self.v_pool[table[p // self.block_size], p % self.block_size] = v[i]
        self.tables[seq_id] = table
        self.lengths[seq_id] = length + k.shape[0]

    def fork(self, src, dst):
        if dst in self.tables:
            raise ValueError("dst already exists")
        for block in self.tables[src]:
            self.allocator.incref(block)
        self.tables[dst] = self.tables[src][:]
        self.lengths[dst] = self.lengths[src]

    def free(self, seq_id):
        for block in self.tables[seq_id]:
            self.allocator.free(block)
        del self.tables[seq_id]
        del self.lengths[seq_id]

    def gather(self, seq_id):
        ks, vs = [], []
        left = self.lengths[seq_id]
        for block in self.tables[seq_id]:
            n = min(left, self.block_size)
            ks.append(self.k_pool[block, :n])
            vs.append(self.v_pool[block, :n])
            left -= n
        return torch.cat(ks), torch.cat(vs)


def paged_attention(q, cache, seq_ids):
    B, H, hd = q.shape
    rows = []
    for b in range(B):
        k, v = cache.gather(seq_ids[b])
        per_kv = H // k.shape[1]
        heads = []
        for h in range(H):
            kh = k[:, h // per_kv].to(q.dtype)   # (L, hd)
            vh = v[:, h // per_kv].to(q.dtype)
            w = torch.softmax(kh @ q[b, h], dim=0)
            heads.append(w @ vh)
        rows.append(torch.stack(heads))
    return torch.stack(rows)
