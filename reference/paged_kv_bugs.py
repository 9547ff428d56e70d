"""Known paged-KV-cache bugs, each the reference with exactly that mistake (variants: the same
mistake as different people write it: in the count of blocks or in the read of the last one, in
the allocator or in fork, on the write side or the read side)."""
import math

import torch

from reference.paged_kv import BlockAllocator, PagedKVCache, paged_attention


def _ceil(n, d):
    return -(-n // d)


class _Cache(PagedKVCache):
    """The reference's cache with its append split into hooks the bugs below change one at a time."""

    def blocks_needed(self, n_tokens):
        return _ceil(n_tokens, self.block_size)

    def needs_copy(self, seq_id, L):
        table = self.block_tables.get(seq_id, [])
        return L % self.block_size != 0 and self.allocator.refcount(table[-1]) > 1

    def positions(self, seq_id, L, t):
        return torch.arange(L, L + t)

    def write(self, table, pos, k, v):
        blocks = torch.tensor(table, dtype=torch.long)[pos // self.block_size]
        self.k_cache[blocks, pos % self.block_size] = k.to(self.k_cache.dtype)
        self.v_cache[blocks, pos % self.block_size] = v.to(self.v_cache.dtype)

    def copy_on_write(self, table):
        old, new = table[-1], self.allocator.allocate()
        self.k_cache[new] = self.k_cache[old]
        self.v_cache[new] = self.v_cache[old]
        self.allocator.free(old)
        table[-1] = new

    def append(self, seq_id, k, v):
        table = self.block_tables.get(seq_id, [])
        L = self.seq_lens.get(seq_id, 0)
        t = k.shape[0]
        new_blocks = max(self.blocks_needed(L + t) - len(table), 0)
        copy = self.needs_copy(seq_id, L)
        if new_blocks + copy > self.allocator.num_free():
            raise RuntimeError(f"out of blocks: sequence {seq_id} needs {new_blocks + copy}")
        if copy:
            self.copy_on_write(table)
        for _ in range(new_blocks):
            table.append(self.allocator.allocate())
        self.write(table, self.positions(seq_id, L, t), k, v)
        self.block_tables[seq_id] = table
        self.seq_lens[seq_id] = L + t


# --- last-block-off-by-one --------------------------------------------------------------------

class OneBlockTooMany(_Cache):
    def blocks_needed(self, n_tokens):
        # len // block_size + 1: right while the last block is partial, one block too many (empty)
        # whenever the length is a multiple of block_size.
        return n_tokens // self.block_size + 1


class LastBlockFillByModulo(_Cache):
    def gather(self, seq_id):
        # every block full but the last, which holds L % block_size tokens: 0 when it is full, so a
        # sequence whose length is a multiple of block_size loses its whole last block.
        L, bs = self.seq_lens[seq_id], self.block_size
        table = self.block_tables[seq_id]
        ks, vs = [], []
        for i, block in enumerate(table):
            n = bs if i < len(table) - 1 else L % bs
            ks.append(self.k_cache[block, :n])
            vs.append(self.v_cache[block, :n])
        return torch.cat(ks), torch.cat(vs)


class GatherWholeLastBlock(_Cache):
    def gather(self, seq_id):
        # len(table) * block_size tokens: the last block read to its end, its unwritten slots (zeros,
        # or a freed sequence's old keys) included.
        table = torch.tensor(self.block_tables[seq_id], dtype=torch.long)
        return self.k_cache[table].flatten(0, 1), self.v_cache[table].flatten(0, 1)


# --- block-reused-while-referenced ------------------------------------------------------------

class FreeIgnoresRefcount(BlockAllocator):
    def free(self, block):
        self.ref_counts[block] = 0   # back on the free list at once, however many tables still hold it
        if block not in self.free_blocks:
            self.free_blocks.append(block)


class FreeOneReferenceEarly(BlockAllocator):
    def free(self, block):
        self.ref_counts[block] -= 1
        if self.ref_counts[block] <= 1:   # off by one: freed while one reference is left
            if block not in self.free_blocks:
                self.free_blocks.append(block)


class _CacheWith(_Cache):
    allocator_class = BlockAllocator

    def __init__(self, num_blocks, block_size, n_kv_heads, head_dim, dtype=torch.float32, device=None):
        super().__init__(num_blocks, block_size, n_kv_heads, head_dim, dtype=dtype, device=device)
        self.allocator = self.allocator_class(num_blocks, block_size)


class CacheFreeIgnoresRefcount(_CacheWith):
    allocator_class = FreeIgnoresRefcount


class CacheFreeOneReferenceEarly(_CacheWith):
    allocator_class = FreeOneReferenceEarly


class ForkWithoutIncref(_Cache):
    def fork(self, src, dst):
        if dst in self.block_tables:
            raise ValueError(f"sequence {dst} exists already")
        # the table is copied but no block gains a reference: freeing either sequence frees them all
        self.block_tables[dst] = list(self.block_tables[src])
        self.seq_lens[dst] = self.seq_lens[src]

    def needs_copy(self, seq_id, L):
        # the reference counts no longer see the sharing: copy on write as if they did, so that only
        # the missing references are wrong
        table = self.block_tables.get(seq_id, [])
        shared = sum(table[-1] in other for s, other in self.block_tables.items() if s != seq_id) if table else 0
        return L % self.block_size != 0 and shared > 0

    def copy_on_write(self, table):
        old, new = table[-1], self.allocator.allocate()
        self.k_cache[new] = self.k_cache[old]
        self.v_cache[new] = self.v_cache[old]
        table[-1] = new   # the old block stays with the sequence that shares it


# --- slot-from-global-position ----------------------------------------------------------------

class SlotFromCacheWideCount(_Cache):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tokens_written = 0   # every sequence's tokens, counted together

    def write(self, table, pos, k, v):
        # the block from the sequence's position, but the slot inside it from the cache-wide count of
        # tokens written (vLLM's slot_mapping built from the batch's token index): right for the first
        # sequence alone, scattered as soon as two sequences interleave.
        blocks = torch.tensor(table, dtype=torch.long)[pos // self.block_size]
        slots = torch.arange(self.tokens_written, self.tokens_written + len(pos)) % self.block_size
        self.tokens_written += len(pos)
        self.k_cache[blocks, slots] = k.to(self.k_cache.dtype)
        self.v_cache[blocks, slots] = v.to(self.v_cache.dtype)


class SlotMappingFromBatchPosition(SlotFromCacheWideCount):
    def write(self, table, pos, k, v):
        # vLLM's slot mapping, table[p // block_size] * block_size + p % block_size, with p the token's
        # index among every token the cache was given (a batch-wide position), not its position in its
        # own sequence: right for one sequence alone; with two, a wrong block, a wrong slot, or past
        # the end of the table.
        p = torch.arange(self.tokens_written, self.tokens_written + len(pos))
        self.tokens_written += len(pos)
        flat = torch.tensor(table, dtype=torch.long)[p // self.block_size] * self.block_size + p % self.block_size
        self.k_cache.flatten(0, 1)[flat] = k.to(self.k_cache.dtype)   # a view: writes the pool
        self.v_cache.flatten(0, 1)[flat] = v.to(self.v_cache.dtype)


class GatherFlatPosition(_Cache):
    def gather(self, seq_id):
        # position p read from slot p of the flat pool, as if the sequence's blocks were the pool's
        # first ones, in order: right only for a sequence whose table is [0, 1, 2, ...].
        L = self.seq_lens[seq_id]
        flat_k = self.k_cache.flatten(0, 1)   # (num_blocks * block_size, Hkv, hd)
        flat_v = self.v_cache.flatten(0, 1)
        return flat_k[:L], flat_v[:L]


class WriteAtSequenceStartPlusPosition(_Cache):
    def write(self, table, pos, k, v):
        # the flat slot table[0] * block_size + p: the sequence's blocks assumed contiguous from its
        # first one (a (B, T_max) buffer's indexing carried over), wrapped at the pool's end.
        n_slots = self.k_cache.shape[0] * self.block_size
        flat = (table[0] * self.block_size + pos) % n_slots
        self.k_cache.view(n_slots, *self.k_cache.shape[2:])[flat] = k.to(self.k_cache.dtype)
        self.v_cache.view(n_slots, *self.v_cache.shape[2:])[flat] = v.to(self.v_cache.dtype)



class SlotMappingFromFirstBlock(_Cache):
    """The same flat slot, table[0] * block_size + p, on the write and on the read (one slot mapping
    for both, as vLLM's is): a sequence reads its own tokens back while nothing else is written
    between its blocks, and past the pool's end the index raises."""

    def slots(self, seq_id, pos):
        return self.block_tables[seq_id][0] * self.block_size + pos

    def write(self, table, pos, k, v):
        flat = table[0] * self.block_size + pos
        self.k_cache.flatten(0, 1)[flat] = k.to(self.k_cache.dtype)   # a view: writes the pool
        self.v_cache.flatten(0, 1)[flat] = v.to(self.v_cache.dtype)

    def gather(self, seq_id):
        flat = self.slots(seq_id, torch.arange(self.seq_lens[seq_id]))
        return self.k_cache.flatten(0, 1)[flat], self.v_cache.flatten(0, 1)[flat]

# --- shared-block-written-in-place ------------------------------------------------------------

class NoCopyOnWrite(_Cache):
    def needs_copy(self, seq_id, L):
        return False   # the shared last block is written in place: the other sequence reads the new tokens


class CopyButWriteTheOld(_Cache):
    def append(self, seq_id, k, v):
        # the copy is made and put in the table, but the physical blocks of the write were looked up
        # before it: the new tokens land in the shared block, the private copy misses them.
        table = self.block_tables.get(seq_id, [])
        L = self.seq_lens.get(seq_id, 0)
        t = k.shape[0]
        new_blocks = max(self.blocks_needed(L + t) - len(table), 0)
        copy = self.needs_copy(seq_id, L)
        if new_blocks + copy > self.allocator.num_free():
            raise RuntimeError(f"out of blocks: sequence {seq_id} needs {new_blocks + copy}")
        for _ in range(new_blocks):
            table.append(self.allocator.allocate())
        before = list(table)
        if copy:
            self.copy_on_write(table)
        self.write(before, self.positions(seq_id, L, t), k, v)
        self.block_tables[seq_id] = table
        self.seq_lens[seq_id] = L + t


# --- kv-repeat-tiled ---------------------------------------------------------------------------

def paged_attention_kv_tiled(q, cache, seq_ids):
    B, H, hd = q.shape
    outs = []
    for b, seq_id in enumerate(seq_ids):
        k, v = cache.gather(seq_id)   # (L, Hkv, hd) each
        n_rep = H // k.shape[1]
        # repeat tiles the heads, [kv0, kv1, kv0, kv1]: query head j reads KV head j % Hkv, not j // n_rep
        k = k.transpose(0, 1).repeat(n_rep, 1, 1).to(q.dtype)   # (H, L, hd)
        v = v.transpose(0, 1).repeat(n_rep, 1, 1).to(q.dtype)   # (H, L, hd)
        scores = (k @ q[b].unsqueeze(-1)).squeeze(-1) / math.sqrt(hd)   # (H, L)
        outs.append(torch.softmax(scores, dim=-1).unsqueeze(1) @ v)   # (H, 1, hd)
    return torch.cat(outs, dim=1).transpose(0, 1)   # (B, H, hd)


# --- no-scaling, double-scale -----------------------------------------------------------------

def paged_attention_no_scaling(q, cache, seq_ids):
    B, H, hd = q.shape
    outs = []
    for b, seq_id in enumerate(seq_ids):
        k, v = cache.gather(seq_id)   # (L, Hkv, hd) each
        n_rep = H // k.shape[1]
        k = k.transpose(0, 1).repeat_interleave(n_rep, dim=0).to(q.dtype)   # (H, L, hd)
        v = v.transpose(0, 1).repeat_interleave(n_rep, dim=0).to(q.dtype)   # (H, L, hd)
        scores = (k @ q[b].unsqueeze(-1)).squeeze(-1)   # (H, L): never divided by sqrt(hd)
        outs.append(torch.softmax(scores, dim=-1).unsqueeze(1) @ v)   # (H, 1, hd)
    return torch.cat(outs, dim=1).transpose(0, 1)   # (B, H, hd)


def paged_attention_double_scale(q, cache, seq_ids):
    # q scaled by 1/sqrt(hd), then the reference scales the scores again: divided by hd in all
    return paged_attention(q / math.sqrt(q.shape[-1]), cache, seq_ids)


# --- softmax-wrong-dim ------------------------------------------------------------------------

def paged_attention_softmax_over_heads(q, cache, seq_ids):
    B, H, hd = q.shape
    outs = []
    for b, seq_id in enumerate(seq_ids):
        k, v = cache.gather(seq_id)   # (L, Hkv, hd) each
        n_rep = H // k.shape[1]
        k = k.transpose(0, 1).repeat_interleave(n_rep, dim=0).to(q.dtype)   # (H, L, hd)
        v = v.transpose(0, 1).repeat_interleave(n_rep, dim=0).to(q.dtype)   # (H, L, hd)
        scores = (k @ q[b].unsqueeze(-1)).squeeze(-1) / math.sqrt(hd)   # (H, L)
        # dim=0 normalises each key's column over the heads, not each head's row over the keys
        outs.append(torch.softmax(scores, dim=0).unsqueeze(1) @ v)   # (H, 1, hd)
    return torch.cat(outs, dim=1).transpose(0, 1)   # (B, H, hd)


# --- fork-aliases-block-table ----------------------------------------------------------------

class ForkSharesTheTableList(_Cache):
    def fork(self, src, dst):
        if dst in self.block_tables:
            raise ValueError(f"sequence {dst} exists already")
        for block in self.block_tables[src]:
            self.allocator.incref(block)
        # src's own list, not a copy: append grows and rewrites a table in place, so every change to
        # one sequence's table (a new block, the copy of a shared one) is the other's too.
        self.block_tables[dst] = self.block_tables[src]
        self.seq_lens[dst] = self.seq_lens[src]


# --- banned-api -------------------------------------------------------------------------------

def sdpa_paged_attention(q, cache, seq_ids):
    # the right values through the library's attention, which this kata asks to write by hand
    outs = []
    for b, seq_id in enumerate(seq_ids):
        k, v = cache.gather(seq_id)   # (L, Hkv, hd)
        y = torch.nn.functional.scaled_dot_product_attention(q[b].unsqueeze(1), k.transpose(0, 1).to(q.dtype),
                                                             v.transpose(0, 1).to(q.dtype), enable_gqa=True)
        outs.append(y.squeeze(1))   # (H, hd)
    return torch.stack(outs)   # (B, H, hd)


BUGS = {
    "last-block-off-by-one": [{"PagedKVCache": OneBlockTooMany}, {"PagedKVCache": LastBlockFillByModulo},
                              {"PagedKVCache": GatherWholeLastBlock}],
    "block-reused-while-referenced": [{"BlockAllocator": FreeIgnoresRefcount, "PagedKVCache": CacheFreeIgnoresRefcount},
                                      {"BlockAllocator": FreeOneReferenceEarly,
                                       "PagedKVCache": CacheFreeOneReferenceEarly},
                                      {"PagedKVCache": ForkWithoutIncref}],
    "slot-from-global-position": [{"PagedKVCache": SlotFromCacheWideCount}, {"PagedKVCache": GatherFlatPosition},
                                  {"PagedKVCache": WriteAtSequenceStartPlusPosition},
                                  {"PagedKVCache": SlotMappingFromFirstBlock},
                                  {"PagedKVCache": SlotMappingFromBatchPosition}],
    "shared-block-written-in-place": [{"PagedKVCache": NoCopyOnWrite}, {"PagedKVCache": CopyButWriteTheOld}],
    "fork-aliases-block-table": {"PagedKVCache": ForkSharesTheTableList},
    "kv-repeat-tiled": {"paged_attention": paged_attention_kv_tiled},
    "no-scaling": {"paged_attention": paged_attention_no_scaling},
    "double-scale": {"paged_attention": paged_attention_double_scale},
    "softmax-wrong-dim": {"paged_attention": paged_attention_softmax_over_heads},
    "banned-api": {"paged_attention": sdpa_paged_attention},
}

