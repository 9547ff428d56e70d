"""Known prefix-cache bugs, each the reference with exactly that mistake (variants: the same mistake
as different people write it: in block_hash or in the cache that calls it, in the touch or in free,
in the order of the free queue or in the end it is taken from)."""
from reference.prefix_cache import PrefixCache, block_hash


# --- hash-without-parent ------------------------------------------------------------------------

def block_hash_without_parent(parent_hash, tokens, extra_keys=None):
    # the block's own tokens only: the same tokens at another depth, after another prefix, hit
    return hash((tuple(tokens), None if extra_keys is None else tuple(extra_keys)))


class CacheWithoutParent(PrefixCache):
    def _hashes(self, tokens, extra_keys):
        return [block_hash_without_parent(None, tokens[start:start + self.block_size], extra_keys)
                for start in range(0, len(tokens) - self.block_size + 1, self.block_size)]


class CacheKeyedByTokens(PrefixCache):
    """block_hash is right, but the cache keys its dict by the block's tokens and extra keys."""

    def _hashes(self, tokens, extra_keys):
        return [(tuple(tokens[start:start + self.block_size]), extra_keys)
                for start in range(0, len(tokens) - self.block_size + 1, self.block_size)]


# --- partial-block-shared -----------------------------------------------------------------------

class CacheSharesPartialBlock(PrefixCache):
    """Hashes every chunk of block_size tokens, the partial last one too, and counts the last token
    out of the tokens rather than out of the blocks: an identical prompt shares its last block,
    which the request must write."""

    def _hashes(self, tokens, extra_keys):
        hashes, parent = [], None
        for start in range(0, len(tokens), self.block_size):
            parent = block_hash(parent, tokens[start:start + self.block_size], extra_keys)
            hashes.append(parent)
        return hashes

    def allocate(self, request_id, tokens, extra_keys=None):
        bs = self.block_size
        hashes = self._hashes(tokens, extra_keys)
        hits = []
        for h in hashes:
            if h not in self.cached:
                break
            hits.append(self.cached[h])
        n_new = -(-len(tokens) // bs) - len(hits)
        idle_hits = sum(self.ref_counts[b] == 0 for b in hits)
        if n_new > len(self.free_queue) - idle_hits:
            raise RuntimeError(f"out of blocks: request {request_id!r} needs {n_new} free blocks")
        for block in hits:
            if self.ref_counts[block] == 0:
                del self.free_queue[block]
            self.ref_counts[block] += 1
        blocks = hits + [self._take_free_block() for _ in range(n_new)]
        for block in blocks[len(hits):]:
            self.ref_counts[block] = 1
        for h, block in zip(hashes[len(hits):], blocks[len(hits):]):
            if h not in self.cached:
                self.cached[h] = block
                self.held_hash[block] = h
        self.requests[request_id] = blocks
        return list(blocks), min(len(hits) * bs, len(tokens) - 1)   # the last token "recomputed" in a shared block


class CacheSharesLastFullBlock(PrefixCache):
    """Full blocks only, but every one may hit: a prompt cached whole shares its last block and
    counts len(tokens) - 1 tokens cached, so the last token is written into a block others read."""

    def allocate(self, request_id, tokens, extra_keys=None):
        bs = self.block_size
        hashes = self._hashes(tokens, extra_keys)
        hits = []
        for h in hashes:
            if h not in self.cached:
                break
            hits.append(self.cached[h])
        n_new = -(-len(tokens) // bs) - len(hits)
        idle_hits = sum(self.ref_counts[b] == 0 for b in hits)
        if n_new > len(self.free_queue) - idle_hits:
            raise RuntimeError(f"out of blocks: request {request_id!r} needs {n_new} free blocks")
        for block in hits:
            if self.ref_counts[block] == 0:
                del self.free_queue[block]
            self.ref_counts[block] += 1
        blocks = hits + [self._take_free_block() for _ in range(n_new)]
        for block in blocks[len(hits):]:
            self.ref_counts[block] = 1
        for h, block in zip(hashes[len(hits):], blocks[len(hits):]):
            if h not in self.cached:
                self.cached[h] = block
                self.held_hash[block] = h
        self.requests[request_id] = blocks
        return list(blocks), min(len(hits) * bs, len(tokens) - 1)


# --- evicts-referenced-block --------------------------------------------------------------------

class CacheTouchLeavesQueue(PrefixCache):
    """A hit gains a reference but stays in the free queue: it is taken again while held."""

    def allocate(self, request_id, tokens, extra_keys=None):
        bs = self.block_size
        hashes = self._hashes(tokens, extra_keys)
        hits = []
        for h in hashes[:(len(tokens) - 1) // bs]:
            if h not in self.cached:
                break
            hits.append(self.cached[h])
        n_new = -(-len(tokens) // bs) - len(hits)
        idle_hits = sum(self.ref_counts[b] == 0 for b in hits)
        if n_new > len(self.free_queue) - idle_hits:
            raise RuntimeError(f"out of blocks: request {request_id!r} needs {n_new} free blocks")
        for block in hits:
            self.ref_counts[block] += 1   # still in the free queue
        blocks = hits + [self._take_free_block() for _ in range(n_new)]
        for block in blocks[len(hits):]:
            self.ref_counts[block] = 1
        for h, block in zip(hashes[len(hits):], blocks[len(hits):]):
            if h not in self.cached:
                self.cached[h] = block
                self.held_hash[block] = h
        self.requests[request_id] = blocks
        return list(blocks), len(hits) * bs


class CacheFreeIgnoresRefcount(PrefixCache):
    """free queues every block of the request, though another request still holds it."""

    def free(self, request_id):
        for block in reversed(self.requests.pop(request_id)):
            self.ref_counts[block] -= 1
            self.free_queue[block] = None


# --- eviction-not-lru ---------------------------------------------------------------------------

class CacheFreesInTokenOrder(PrefixCache):
    """A request's blocks join the free queue first block first: its prefix is evicted before its tail."""

    def free(self, request_id):
        for block in self.requests.pop(request_id):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_queue[block] = None


class CacheTakesMostRecentlyFreed(PrefixCache):
    """The free queue used as a stack: the block freed last is taken first."""

    def _take_free_block(self):
        block, _ = self.free_queue.popitem(last=True)
        if self.held_hash[block] is not None:
            del self.cached[self.held_hash[block]]
            self.held_hash[block] = None
        return block


# --- hash-dropped-on-free -----------------------------------------------------------------------

class CacheDropsHashOnFree(PrefixCache):
    """A block left with no reference forgets its hash: nothing hits after the request ends."""

    def free(self, request_id):
        for block in reversed(self.requests.pop(request_id)):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                if self.held_hash[block] is not None:
                    del self.cached[self.held_hash[block]]
                    self.held_hash[block] = None
                self.free_queue[block] = None


# --- extra-keys-ignored -------------------------------------------------------------------------

def block_hash_without_extra_keys(parent_hash, tokens, extra_keys=None):
    # the LoRA id and the cache salt left out: another adapter's, or another tenant's, blocks hit
    return hash((parent_hash, tuple(tokens)))


class CacheWithoutExtraKeys(PrefixCache):
    def _hashes(self, tokens, extra_keys):
        hashes, parent = [], None
        for start in range(0, len(tokens) - self.block_size + 1, self.block_size):
            parent = block_hash_without_extra_keys(parent, tokens[start:start + self.block_size], extra_keys)
            hashes.append(parent)
        return hashes


class CacheDropsExtraKeys(PrefixCache):
    """block_hash is right, but the cache never hands it the request's extra keys."""

    def _hashes(self, tokens, extra_keys):
        return super()._hashes(tokens, None)


# --- evicted-hash-kept --------------------------------------------------------------------------

class CacheKeepsEvictedHash(PrefixCache):
    """Taking a block for new tokens leaves its old hash in the dict: a later request with the old
    prefix hits a block that now holds other tokens, and the dict grows with every prompt."""

    def _take_free_block(self):
        block, _ = self.free_queue.popitem(last=False)
        self.held_hash[block] = None
        return block


BUGS = {
    "hash-without-parent": [{"block_hash": block_hash_without_parent, "PrefixCache": CacheWithoutParent},
                            {"PrefixCache": CacheKeyedByTokens}],
    "partial-block-shared": [{"PrefixCache": CacheSharesPartialBlock}, {"PrefixCache": CacheSharesLastFullBlock}],
    "evicts-referenced-block": [{"PrefixCache": CacheTouchLeavesQueue}, {"PrefixCache": CacheFreeIgnoresRefcount}],
    "eviction-not-lru": [{"PrefixCache": CacheFreesInTokenOrder}, {"PrefixCache": CacheTakesMostRecentlyFreed}],
    "hash-dropped-on-free": {"PrefixCache": CacheDropsHashOnFree},
    "extra-keys-ignored": [{"block_hash": block_hash_without_extra_keys, "PrefixCache": CacheWithoutExtraKeys},
                           {"PrefixCache": CacheDropsExtraKeys}],
    "evicted-hash-kept": {"PrefixCache": CacheKeepsEvictedHash},
}
