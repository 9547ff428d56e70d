"""A prefix cache of KV blocks, as vLLM V1 builds it (katas/prefix-cache/README.md).

vLLM's design note (docs/design/prefix_caching.md) and its code (vllm/v1/core/kv_cache_utils.py,
block_pool.py, kv_cache_manager.py): a full block is named by the hash of its parent block's hash,
its own tokens and extra keys (a LoRA id, a cache salt), so one hash stands for the whole prefix up
to the block's end. A new request takes the longest run of its full blocks found by hash; the rest
come from the head of a free queue, least recently used first, evicting the hash a block held. A
freed block keeps its hash at the queue's tail until it is evicted, so a later request still hits.

Only the bookkeeping is here, as plain Python: block ids, hashes, reference counts. The keys and
values a block holds are paged-kv's pool; which ids a request gets is this cache's answer.
"""
from collections import OrderedDict


def block_hash(parent_hash, tokens, extra_keys=None):
    """The hash of one full block: ``parent_hash`` (the previous block's hash, None for the first
    block), the block's ``tokens`` (a sequence of ints) and ``extra_keys`` (a tuple of ints and
    strings, or None). Equal inputs give equal hashes, and a different parent, token or extra key
    a different hash. Returns an int or a str (a sha256 hex digest will do)."""
    # A tuple hashes its items in order: the parent's hash makes the whole prefix part of this one.
    return hash((parent_hash, tuple(tokens), None if extra_keys is None else tuple(extra_keys)))


class PrefixCache:
    """``num_blocks`` blocks of ``block_size`` tokens, shared across requests by the hashes of their
    full blocks.

    Every block starts in the free queue (any order); a freed block joins its tail, so the head is
    the least recently used block, and blocks never used are taken before any freed one. A block in
    the free queue may still hold a hash: it is a cache hit until it is taken for something else.
    """

    def __init__(self, num_blocks: int, block_size: int):
        """An empty cache: every block free, no hash cached."""
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks   # requests holding each block; 0 = in the free queue
        self.held_hash = [None] * num_blocks   # the hash a block is cached under, None if none
        self.free_queue = OrderedDict.fromkeys(range(num_blocks))   # head: least recently used
        self.cached = {}   # hash -> the block cached under it
        self.requests = {}   # request_id -> its blocks, in token order

    def _hashes(self, tokens, extra_keys):
        """The chained hashes of the full blocks of ``tokens``; a partial last block has none."""
        hashes, parent = [], None
        for start in range(0, len(tokens) - self.block_size + 1, self.block_size):
            parent = block_hash(parent, tokens[start:start + self.block_size], extra_keys)
            hashes.append(parent)
        return hashes

    def _take_free_block(self) -> int:
        """The head of the free queue, evicting the hash it held: nobody can hit it from now on."""
        block, _ = self.free_queue.popitem(last=False)
        if self.held_hash[block] is not None:
            del self.cached[self.held_hash[block]]
            self.held_hash[block] = None
        return block

    def allocate(self, request_id, tokens, extra_keys=None) -> tuple[list[int], int]:
        """Blocks for a new request's prompt ``tokens`` (at least one token). Returns
        ``(block_ids, num_cached_tokens)``: ceil(len(tokens) / block_size) block ids in token order,
        its cache hits first, and the number of tokens whose keys and values those hits hold.

        A hit is one of the longest run of the prompt's full blocks, from the first, whose hashes
        are cached, but never the block of the last token: its logits must be computed, so at most
        (len(tokens) - 1) // block_size blocks hit. Each hit gains a reference (and leaves the free
        queue); the other blocks are taken from the free queue's head, and each of them that the
        prompt fills is cached under its hash, unless another block already is. Raises
        RuntimeError, changing nothing, when the free queue cannot supply them."""
        bs = self.block_size
        hashes = self._hashes(tokens, extra_keys)
        hits = []
        for h in hashes[:(len(tokens) - 1) // bs]:   # the last token is always computed again
            if h not in self.cached:
                break   # the first miss ends the prefix: later blocks hash it in
            hits.append(self.cached[h])
        n_new = -(-len(tokens) // bs) - len(hits)
        idle_hits = sum(self.ref_counts[b] == 0 for b in hits)   # hits that are in the free queue
        if n_new > len(self.free_queue) - idle_hits:
            raise RuntimeError(f"out of blocks: request {request_id!r} needs {n_new} free blocks")
        for block in hits:   # touch: referenced blocks are never evicted
            if self.ref_counts[block] == 0:
                del self.free_queue[block]
            self.ref_counts[block] += 1
        blocks = hits + [self._take_free_block() for _ in range(n_new)]
        for block in blocks[len(hits):]:
            self.ref_counts[block] = 1
        for h, block in zip(hashes[len(hits):], blocks[len(hits):]):   # the full blocks computed now
            if h not in self.cached:   # a full prompt already cached: its last block stays a copy
                self.cached[h] = block
                self.held_hash[block] = h
        self.requests[request_id] = blocks
        return list(blocks), len(hits) * bs

    def free(self, request_id) -> None:
        """The request is finished: each of its blocks loses a reference, and a block left with none
        joins the free queue's tail KEEPING its hash, the request's last block first, so that a
        request's tail (the longest prefix, the least likely to be asked again) is evicted first."""
        for block in reversed(self.requests.pop(request_id)):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_queue[block] = None   # the tail: most recently used

    def refcount(self, block_id: int) -> int:
        """How many running requests hold block ``block_id``: 0 when it is in the free queue."""
        return self.ref_counts[block_id]
