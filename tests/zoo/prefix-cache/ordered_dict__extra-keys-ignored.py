"""The OrderedDict LRU whose hash leaves out the extra keys: another LoRA adapter's or another
tenant's blocks hit."""
import hashlib
from collections import OrderedDict
from dataclasses import dataclass


def block_hash(parent_hash, tokens, extra_keys=None):
    h = hashlib.sha256()
    h.update(b"root" if parent_hash is None else parent_hash.encode())
    h.update(b"|" + b",".join(str(t).encode() for t in tokens))
    return h.hexdigest()


@dataclass
class Block:
    refs: int = 0
    key: str | None = None


class PrefixCache:
    def __init__(self, num_blocks, block_size):
        self.size = block_size
        self.blocks = [Block() for _ in range(num_blocks)]
        self.lru = OrderedDict((b, True) for b in range(num_blocks))
        self.index = {}
        self.owned = {}

    def allocate(self, request_id, tokens, extra_keys=None):
        size, keys, parent = self.size, [], None
        for start in range(0, len(tokens) // size * size, size):
            parent = block_hash(parent, tokens[start:start + size], extra_keys)
            keys.append(parent)
        hit = []
        for key in keys[:(len(tokens) - 1) // size]:
            if key not in self.index:
                break
            hit.append(self.index[key])
        total = (len(tokens) + size - 1) // size
        if total - len(hit) > len(self.lru) - len([b for b in hit if b in self.lru]):
            raise RuntimeError("not enough free blocks")
        for b in hit:
            self.lru.pop(b, None)
            block = self.blocks[b]
            block.refs += 1
        fresh = []
        while len(hit) + len(fresh) < total:
            b, _ = self.lru.popitem(last=False)
            old = self.blocks[b].key
            if old is not None:
                self.index.pop(old)
            self.blocks[b] = Block(refs=1)
            fresh.append(b)
        for key, b in zip(keys[len(hit):], fresh):
            if key not in self.index:
                self.index[key] = b
                block = self.blocks[b]
                block.key = key
        self.owned[request_id] = hit + fresh
        return hit + fresh, len(hit) * size

    def free(self, request_id):
        for b in self.owned.pop(request_id)[::-1]:
            block = self.blocks[b]
            block.refs -= 1
            if block.refs == 0:
                self.lru[b] = True
                self.lru.move_to_end(b)

    def refcount(self, block_id):
        return self.blocks[block_id].refs
