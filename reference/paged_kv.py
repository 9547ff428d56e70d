"""A paged KV cache (vLLM's PagedAttention, in plain PyTorch) (katas/paged-kv/README.md).

The keys and values of every sequence live in one pool of fixed-size blocks; each sequence owns a
block table, the list of its blocks in order: logical block b of a sequence (its tokens
b * block_size .. (b + 1) * block_size - 1) lives in physical block ``block_table[b]``. A sequence
of L tokens holds ceil(L / block_size) blocks, whatever the other sequences' lengths: no
(B, T_max) padded buffer. Blocks are reference-counted, so two sequences can share a prompt's
blocks; a sequence that appends into a block it shares copies it first (copy on write).

Layouts follow vLLM: tokens are (t, n_kv_heads, head_dim), the pool (num_blocks, block_size,
n_kv_heads, head_dim), one decoding query per sequence (B, n_heads, head_dim).
"""
import math

import torch


class BlockAllocator:
    """The free list and the reference counts of ``num_blocks`` blocks of ``block_size`` tokens.

    ``allocate()`` hands out a free block with reference count 1; ``incref(b)`` adds a reference
    (a second sequence shares it); ``free(b)`` drops one, and the block is free again, to be handed
    out by a later ``allocate()``, only when no reference is left.
    """

    def __init__(self, num_blocks: int, block_size: int):
        """Raises ValueError unless ``num_blocks >= 1`` and ``block_size >= 1``."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be at least 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks   # references to each block; 0 = free
        self.free_blocks = list(range(num_blocks - 1, -1, -1))   # a stack: block 0 is handed out first

    def allocate(self) -> int:
        """A free block's id, now with reference count 1. Raises RuntimeError when none is free."""
        if not self.free_blocks:
            raise RuntimeError(f"out of blocks: all {self.num_blocks} are in use")
        block = self.free_blocks.pop()
        self.ref_counts[block] = 1
        return block

    def incref(self, block: int) -> None:
        """One more reference to a block in use (a sequence starts sharing it)."""
        if self.ref_counts[block] < 1:
            raise ValueError(f"block {block} is free: only a block in use can be shared")
        self.ref_counts[block] += 1

    def free(self, block: int) -> None:
        """Drop one reference; the block goes back to the free list when it was the last one."""
        if self.ref_counts[block] < 1:
            raise ValueError(f"block {block} is already free")
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:   # still referenced: another sequence reads it, keep it
            self.free_blocks.append(block)

    def refcount(self, block: int) -> int:
        """How many block tables hold this block (0 = free)."""
        return self.ref_counts[block]

    def num_free(self) -> int:
        """The number of blocks that ``allocate()`` can still hand out."""
        return len(self.free_blocks)


class PagedKVCache:
    """The keys and values of many sequences, in a pool of blocks, one block table per sequence.

    ``append(seq_id, k, v)`` adds t tokens to a sequence (a new seq_id starts an empty one), k and v
    ``(t, n_kv_heads, head_dim)``; ``fork(src, dst)`` starts ``dst`` as a copy of ``src`` that shares
    all its blocks; ``free(seq_id)`` gives back the sequence's references; ``gather(seq_id)`` reads a
    sequence back, contiguous, through its block table.
    """

    def __init__(self, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device=None):
        """An empty cache over a pool of ``num_blocks`` blocks, each ``(block_size, n_kv_heads,
        head_dim)`` for K and for V, of ``dtype`` on ``device``; ``self.allocator`` is its
        BlockAllocator. Raises ValueError unless ``num_blocks >= 1`` and ``block_size >= 1``."""
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.block_size = block_size
        # The whole pool, allocated once: memory does not grow with the sequences, it is shared.
        self.k_cache = torch.zeros(num_blocks, block_size, n_kv_heads, head_dim, dtype=dtype, device=device)
        self.v_cache = torch.zeros(num_blocks, block_size, n_kv_heads, head_dim, dtype=dtype, device=device)
        self.block_tables: dict[int, list[int]] = {}   # seq_id -> its physical blocks, in order
        self.seq_lens: dict[int, int] = {}   # seq_id -> its number of tokens

    def block_table(self, seq_id: int) -> list[int]:
        """The sequence's physical blocks, in order: ceil(len / block_size) of them."""
        return list(self.block_tables[seq_id])

    def seq_len(self, seq_id: int) -> int:
        """The number of tokens the sequence holds."""
        return self.seq_lens[seq_id]

    def append(self, seq_id: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Add t tokens to ``seq_id``, k and v ``(t, n_kv_heads, head_dim)`` each; a new seq_id starts
        empty. Token i goes to the sequence's position L + i (L its length before), slot
        ``(L + i) % block_size`` of its logical block ``(L + i) // block_size``. A block is allocated
        when a position starts a new one; a shared last block is copied before it is written.
        Raises RuntimeError, before writing anything, when the pool has too few free blocks.
        """
        table = self.block_tables.get(seq_id, [])   # stored below, once nothing can fail
        L = self.seq_lens.get(seq_id, 0)
        t = k.shape[0]
        bs = self.block_size
        new_blocks = -(-(L + t) // bs) - len(table)   # ceil((L + t) / bs) blocks needed, minus those held
        shared_tail = L % bs != 0 and self.allocator.refcount(table[-1]) > 1   # partial and shared: copy it
        if new_blocks + shared_tail > self.allocator.num_free():
            raise RuntimeError(f"out of blocks: sequence {seq_id} needs {new_blocks + shared_tail}, "
                               f"{self.allocator.num_free()} are free")
        if shared_tail:
            # Copy on write: the last block is partial and another sequence holds it too. Writing into
            # it would change what that sequence reads; take a private copy of its tokens first.
            old = table[-1]
            new = self.allocator.allocate()
            self.k_cache[new] = self.k_cache[old]
            self.v_cache[new] = self.v_cache[old]
            self.allocator.free(old)   # one reference fewer: the other sequence keeps it
            table[-1] = new
        for _ in range(new_blocks):
            table.append(self.allocator.allocate())
        pos = torch.arange(L, L + t)   # (t,) the tokens' positions in THIS sequence, not in the pool
        blocks = torch.tensor(table, dtype=torch.long)[pos // bs]   # (t,) the physical block of each
        slots = pos % bs   # (t,) the slot inside it
        self.k_cache[blocks.to(self.k_cache.device), slots.to(self.k_cache.device)] = k.to(self.k_cache.dtype)
        self.v_cache[blocks.to(self.v_cache.device), slots.to(self.v_cache.device)] = v.to(self.v_cache.dtype)
        self.block_tables[seq_id] = table
        self.seq_lens[seq_id] = L + t

    def fork(self, src: int, dst: int) -> None:
        """Start sequence ``dst`` as ``src``'s copy: the same block table, every block shared (one
        more reference each), no key copied. Raises ValueError when ``dst`` exists already."""
        if dst in self.block_tables:
            raise ValueError(f"sequence {dst} exists already")
        for block in self.block_tables[src]:
            self.allocator.incref(block)
        self.block_tables[dst] = list(self.block_tables[src])   # a new list: the tables diverge later
        self.seq_lens[dst] = self.seq_lens[src]

    def free(self, seq_id: int) -> None:
        """Forget the sequence: one reference fewer on each of its blocks (shared ones stay in use)."""
        for block in self.block_tables.pop(seq_id):
            self.allocator.free(block)
        del self.seq_lens[seq_id]

    def gather(self, seq_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequence's keys and values, contiguous, oldest first: ``(L, n_kv_heads, head_dim)`` each."""
        L = self.seq_lens[seq_id]
        table = torch.tensor(self.block_tables[seq_id], dtype=torch.long, device=self.k_cache.device)
        pos = torch.arange(L, device=self.k_cache.device)   # (L,)
        blocks, slots = table[pos // self.block_size], pos % self.block_size   # (L,) each
        return self.k_cache[blocks, slots], self.v_cache[blocks, slots]   # (L, Hkv, hd) each


def paged_attention(q: torch.Tensor, cache: PagedKVCache, seq_ids: list[int]) -> torch.Tensor:
    """One decoding query per sequence against all its cached keys, read through its block table.

    q ``(B, n_heads, head_dim)``, query b from sequence ``seq_ids[b]`` (its newest token, already
    appended) -> ``(B, n_heads, head_dim)`` in q's dtype. Each sequence has its own length: no
    padding, no mask. Query head j reads KV head ``j // (n_heads // n_kv_heads)``; scale
    ``1/sqrt(head_dim)``. Equals SDPA over each sequence's contiguous keys and values.
    """
    B, H, hd = q.shape
    outs = []
    for b, seq_id in enumerate(seq_ids):
        k, v = cache.gather(seq_id)   # (L, Hkv, hd) each
        n_rep = H // k.shape[1]
        k = k.transpose(0, 1).repeat_interleave(n_rep, dim=0).to(q.dtype)   # (H, L, hd)
        v = v.transpose(0, 1).repeat_interleave(n_rep, dim=0).to(q.dtype)   # (H, L, hd)
        scores = (k @ q[b].unsqueeze(-1)).squeeze(-1) / math.sqrt(hd)   # (H, L): the query sees every key
        outs.append(torch.softmax(scores, dim=-1).unsqueeze(1) @ v)   # (H, 1, hd)
    return torch.cat(outs, dim=1).transpose(0, 1)   # (B, H, hd)
