"""Dicts and lists, hashing every chunk of B tokens, the partial last one too, and taking the last
token out of the tokens cached rather than out of the blocks: an identical prompt shares the block
its last token is written into."""


def block_hash(parent_hash, tokens, extra_keys=None):
    return hash(("block", parent_hash, tuple(tokens), tuple(extra_keys) if extra_keys else extra_keys))


class PrefixCache:
    def __init__(self, num_blocks, block_size):
        self.B = block_size
        self.free_list = list(range(num_blocks))
        self.refs = {}
        self.table = {}
        self.hash_of = {}
        self.reqs = {}

    def allocate(self, request_id, tokens, extra_keys=None):
        B = self.B
        n_blocks = -(-len(tokens) // B)
        max_hits = (len(tokens) - 1) // B
        hits, hashes, h, missed = [], [], None, False
        for i in range(n_blocks):
            h = block_hash(h, tokens[i * B:(i + 1) * B], extra_keys)
            hashes.append(h)
            if not missed and h in self.table:
                hits.append(self.table[h])
            else:
                missed = True
        idle = [b for b in hits if b not in self.refs]
        if n_blocks - len(hits) > len(self.free_list) - len(idle):
            raise RuntimeError("KV cache is full")
        for b in hits:
            if b not in self.refs:
                self.free_list.remove(b)
            self.refs[b] = self.refs.get(b, 0) + 1
        blocks = list(hits)
        for i in range(len(hits), n_blocks):
            b = self.free_list.pop(0)
            if b in self.hash_of:
                del self.table[self.hash_of.pop(b)]
            self.refs[b] = 1
            blocks.append(b)
            if i < len(hashes) and hashes[i] not in self.table:
                self.table[hashes[i]] = b
                self.hash_of[b] = hashes[i]
        self.reqs[request_id] = blocks
        return blocks, min(sum(len(tokens[i * B:(i + 1) * B]) for i in range(len(hits))), len(tokens) - 1)

    def free(self, request_id):
        blocks = self.reqs.pop(request_id)
        for b in reversed(blocks):
            self.refs[b] -= 1
            if self.refs[b] == 0:
                del self.refs[b]
                self.free_list.append(b)

    def refcount(self, block_id):
        return self.refs.get(block_id, 0)
