"""Your paged KV cache: a block allocator, a cache of block tables, and attention through them
(katas/paged-kv/README.md). Import only torch and math (and Python's plain helpers)."""
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
        raise NotImplementedError("write BlockAllocator.__init__")

    def allocate(self) -> int:
        """A free block's id, now with reference count 1. Raises RuntimeError when none is free."""
        raise NotImplementedError("write BlockAllocator.allocate")

    def incref(self, block: int) -> None:
        """One more reference to a block in use (a sequence starts sharing it)."""
        raise NotImplementedError("write BlockAllocator.incref")

    def free(self, block: int) -> None:
        """Drop one reference; the block goes back to the free list when it was the last one."""
        raise NotImplementedError("write BlockAllocator.free")

    def refcount(self, block: int) -> int:
        """How many block tables hold this block (0 = free)."""
        raise NotImplementedError("write BlockAllocator.refcount")

    def num_free(self) -> int:
        """The number of blocks that ``allocate()`` can still hand out."""
        raise NotImplementedError("write BlockAllocator.num_free")


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
        raise NotImplementedError("write PagedKVCache.__init__")

    def block_table(self, seq_id: int) -> list[int]:
        """The sequence's physical blocks, in order: ceil(len / block_size) of them."""
        raise NotImplementedError("write PagedKVCache.block_table")

    def seq_len(self, seq_id: int) -> int:
        """The number of tokens the sequence holds."""
        raise NotImplementedError("write PagedKVCache.seq_len")

    def append(self, seq_id: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Add t tokens to ``seq_id``, k and v ``(t, n_kv_heads, head_dim)`` each; a new seq_id starts
        empty. Token i goes to the sequence's position L + i (L its length before), slot
        ``(L + i) % block_size`` of its logical block ``(L + i) // block_size``. A block is allocated
        when a position starts a new one; a shared last block is copied before it is written.
        Raises RuntimeError, before writing anything, when the pool has too few free blocks.
        """
        raise NotImplementedError("write PagedKVCache.append")

    def fork(self, src: int, dst: int) -> None:
        """Start sequence ``dst`` as ``src``'s copy: the same block table, every block shared (one
        more reference each), no key copied. Raises ValueError when ``dst`` exists already."""
        raise NotImplementedError("write PagedKVCache.fork")

    def free(self, seq_id: int) -> None:
        """Forget the sequence: one reference fewer on each of its blocks (shared ones stay in use)."""
        raise NotImplementedError("write PagedKVCache.free")

    def gather(self, seq_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequence's keys and values, contiguous, oldest first: ``(L, n_kv_heads, head_dim)`` each."""
        raise NotImplementedError("write PagedKVCache.gather")


def paged_attention(q: torch.Tensor, cache: PagedKVCache, seq_ids: list[int]) -> torch.Tensor:
    """One decoding query per sequence against all its cached keys, read through its block table.

    q ``(B, n_heads, head_dim)``, query b from sequence ``seq_ids[b]`` (its newest token, already
    appended) -> ``(B, n_heads, head_dim)`` in q's dtype. Each sequence has its own length: no
    padding, no mask. Query head j reads KV head ``j // (n_heads // n_kv_heads)``; scale
    ``1/sqrt(head_dim)``. Equals SDPA over each sequence's contiguous keys and values.
    """
    raise NotImplementedError("write paged_attention")
