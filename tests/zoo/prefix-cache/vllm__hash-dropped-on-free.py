"""vLLM's BlockPool whose free_blocks evicts as it frees: a block at 0 loses its hash at once, so a
request that arrives after the last one with its prefix has ended misses."""
import hashlib
import pickle
from dataclasses import dataclass
from typing import Optional


def block_hash(parent_hash, tokens, extra_keys=None):
    key = (parent_hash, tuple(tokens), None if extra_keys is None else tuple(extra_keys))
    return hashlib.sha256(pickle.dumps(key, protocol=5)).hexdigest()


@dataclass
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: Optional[str] = None
    prev_free_block: Optional["KVCacheBlock"] = None
    next_free_block: Optional["KVCacheBlock"] = None


class FreeKVCacheBlockQueue:
    def __init__(self, blocks):
        self.num_free_blocks = len(blocks)
        self.fake_head = KVCacheBlock(-1)
        self.fake_tail = KVCacheBlock(-1)
        prev = self.fake_head
        for block in blocks:
            prev.next_free_block, block.prev_free_block = block, prev
            prev = block
        prev.next_free_block, self.fake_tail.prev_free_block = self.fake_tail, prev

    def popleft(self):
        block = self.fake_head.next_free_block
        self.remove(block)
        return block

    def remove(self, block):
        block.prev_free_block.next_free_block = block.next_free_block
        block.next_free_block.prev_free_block = block.prev_free_block
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block):
        last = self.fake_tail.prev_free_block
        last.next_free_block, block.prev_free_block = block, last
        block.next_free_block, self.fake_tail.prev_free_block = self.fake_tail, block
        self.num_free_blocks += 1


class BlockPool:
    def __init__(self, num_blocks):
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = {}

    def get_cached_block(self, h):
        return self.cached_block_hash_to_block.get(h)

    def _maybe_evict_cached_block(self, block):
        if block.block_hash is not None:
            del self.cached_block_hash_to_block[block.block_hash]
            block.block_hash = None

    def get_new_blocks(self, n):
        ret = []
        for _ in range(n):
            block = self.free_block_queue.popleft()
            self._maybe_evict_cached_block(block)
            block.ref_cnt += 1
            ret.append(block)
        return ret

    def touch(self, blocks):
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def cache_full_blocks(self, blocks, hashes):
        for block, h in zip(blocks, hashes):
            if h not in self.cached_block_hash_to_block:
                block.block_hash = h
                self.cached_block_hash_to_block[h] = block

    def free_blocks(self, ordered_blocks):
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._maybe_evict_cached_block(block)
                self.free_block_queue.append(block)


class PrefixCache:
    def __init__(self, num_blocks, block_size):
        self.block_size = block_size
        self.block_pool = BlockPool(num_blocks)
        self.req_to_blocks = {}

    def _hash_request_tokens(self, tokens, extra_keys):
        hashes, parent = [], None
        for i in range(len(tokens) // self.block_size):
            parent = block_hash(parent, tokens[i * self.block_size:(i + 1) * self.block_size], extra_keys)
            hashes.append(parent)
        return hashes

    def allocate(self, request_id, tokens, extra_keys=None):
        hashes = self._hash_request_tokens(tokens, extra_keys)
        max_cache_hit_length = len(tokens) - 1
        computed = []
        for h in hashes[:max_cache_hit_length // self.block_size]:
            block = self.block_pool.get_cached_block(h)
            if block is None:
                break
            computed.append(block)
        num_new = (len(tokens) + self.block_size - 1) // self.block_size - len(computed)
        num_evictable_computed = sum(1 for b in computed if b.ref_cnt == 0)
        if num_new > self.block_pool.free_block_queue.num_free_blocks - num_evictable_computed:
            raise RuntimeError("Cannot allocate: not enough free blocks")
        self.block_pool.touch(computed)
        new_blocks = self.block_pool.get_new_blocks(num_new)
        self.block_pool.cache_full_blocks(new_blocks, hashes[len(computed):])
        self.req_to_blocks[request_id] = computed + new_blocks
        return [b.block_id for b in self.req_to_blocks[request_id]], len(computed) * self.block_size

    def free(self, request_id):
        self.block_pool.free_blocks(reversed(self.req_to_blocks.pop(request_id)))

    def refcount(self, block_id):
        return self.block_pool.blocks[block_id].ref_cnt
