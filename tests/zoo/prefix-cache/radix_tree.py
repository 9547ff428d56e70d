"""SGLang's RadixCache idiom (python/sglang/srt/mem_cache/radix_cache.py) at block granularity: a
tree whose edges are blocks of tokens, one root per extra key (SGLang's RadixKey.extra_key, a
LoRA id or a cache salt, keeps such prefixes apart), each node a block with a lock_ref (its
reference count) and a last_access_time; eviction takes the unreferenced block with the oldest
access time (SGLang evicts unreferenced leaves, least recently used first). It gives the
contract's answers because the time is stamped as the contract's queue orders blocks: never-used
blocks are oldest, a request's blocks are stamped last block first when freed, and a parent is
never older than its children. The lookup walks the tree, not a dict of hashes: block_hash
stands alone."""
import itertools


def block_hash(parent_hash, tokens, extra_keys=None):
    return hash((parent_hash, tuple(tokens), extra_keys if extra_keys is None else tuple(extra_keys)))


class TreeNode:
    def __init__(self, parent=None, key=None):
        self.parent = parent
        self.key = key
        self.children = {}
        self.block = None


class PrefixCache:
    def __init__(self, num_blocks, block_size):
        self.page_size = block_size
        self.roots = {}
        self.lock_ref = [0] * num_blocks
        self.node_of = [None] * num_blocks
        self.clock = itertools.count(1)
        self.last_access_time = [0] * num_blocks   # 0: never used, the oldest
        self.req_to_blocks = {}

    def _root(self, extra_keys):
        key = None if extra_keys is None else tuple(extra_keys)
        return self.roots.setdefault(key, TreeNode())

    def match_prefix(self, root, keys):
        node, matched = root, []
        for key in keys:
            child = node.children.get(key)
            if child is None:
                break
            matched.append(child.block)
            node = child
        return matched, node

    def evict_one(self):
        victim = min((b for b in range(len(self.lock_ref)) if self.lock_ref[b] == 0),
                     key=lambda b: self.last_access_time[b])
        node = self.node_of[victim]
        if node is not None:
            del node.parent.children[node.key]
            self.node_of[victim] = None
        return victim

    def allocate(self, request_id, tokens, extra_keys=None):
        ps = self.page_size
        keys = [tuple(tokens[i:i + ps]) for i in range(0, len(tokens) - ps + 1, ps)]
        root = self._root(extra_keys)
        matched, node = self.match_prefix(root, keys[:(len(tokens) - 1) // ps])
        need = -(-len(tokens) // ps) - len(matched)
        evictable = sum(1 for x in self.lock_ref if x == 0) - sum(1 for b in matched if self.lock_ref[b] == 0)
        if need > evictable:
            raise RuntimeError("out of KV blocks")
        for b in matched:
            self.lock_ref[b] += 1
        new = []
        for _ in range(need):
            b = self.evict_one()
            self.lock_ref[b] = 1
            new.append(b)
        for key, b in zip(keys[len(matched):], new):   # insert the full blocks computed now
            if key in node.children:
                break   # cached already: this copy and the blocks after it stay out of the tree
            child = TreeNode(node, key)
            child.block = b
            node.children[key] = child
            self.node_of[b] = child
            node = child
        self.req_to_blocks[request_id] = matched + new
        return list(matched + new), len(matched) * ps

    def free(self, request_id):
        for b in reversed(self.req_to_blocks.pop(request_id)):
            self.lock_ref[b] -= 1
            if self.lock_ref[b] == 0:
                self.last_access_time[b] = next(self.clock)

    def refcount(self, block_id):
        return self.lock_ref[block_id]
