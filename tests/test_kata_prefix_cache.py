"""The prefix-cache kata: the facts its README teaches, on the reference and Python itself, and the
grader on solutions written the way learners write them (not via the bug oracles), one failure
path each."""
import hashlib
import pickle

import numpy as np

from conftest import checks_by_id
from graders.prefix_cache import cache_trace, hash_case, hash_trace, request, streams
from reference.prefix_cache import PrefixCache, block_hash

# Lists and a dict, hits walked in one loop, the free queue a list whose head is pop(0).
SOLUTION = '''
def block_hash(parent_hash, tokens, extra_keys=None):
    return hash((parent_hash, tuple(tokens), extra_keys))


class PrefixCache:
    def __init__(self, num_blocks, block_size):
        self.bs = block_size
        self.queue = list(range(num_blocks))
        self.refs = [0] * num_blocks
        self.hash_of = [None] * num_blocks
        self.by_hash = {}
        self.requests = {}

    def allocate(self, request_id, tokens, extra_keys=None):
        bs, parent, hashes = self.bs, None, []
        for i in range(len(tokens) // bs):
            parent = block_hash(parent, tokens[i * bs:(i + 1) * bs], extra_keys)
            hashes.append(parent)
        hits = []
        for h in hashes[:(len(tokens) - 1) // bs]:
            if h not in self.by_hash:
                break
            hits.append(self.by_hash[h])
        need = -(-len(tokens) // bs) - len(hits)
        if need > len(self.queue) - sum(self.refs[b] == 0 for b in hits):
            raise RuntimeError("out of blocks")
        for b in hits:
            if self.refs[b] == 0:
                self.queue.remove(b)
            self.refs[b] += 1
        blocks = list(hits)
        for i in range(need):
            b = self.queue.pop(0)
            if self.hash_of[b] is not None:
                del self.by_hash[self.hash_of[b]]
                self.hash_of[b] = None
            self.refs[b] = 1
            blocks.append(b)
        for h, b in zip(hashes[len(hits):], blocks[len(hits):]):
            if h not in self.by_hash:
                self.by_hash[h], self.hash_of[b] = b, h
        self.requests[request_id] = blocks
        return blocks, len(hits) * bs

    def free(self, request_id):
        for b in reversed(self.requests.pop(request_id)):
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.queue.append(b)

    def refcount(self, block_id):
        return self.refs[block_id]
'''


def failed(result) -> list[str]:
    return [c["id"] for c in result["checks"] if c["status"] != "passed"]


def edit(old, new, source=SOLUTION):
    assert old in source, old
    return source.replace(old, new)


# --- the facts of the README ------------------------------------------------------------------

def test_a_hash_chained_to_its_parent_tells_depths_apart():
    first = block_hash(None, [1, 2, 3, 4])
    assert block_hash(None, [1, 2, 3, 4]) == first and block_hash(None, (1, 2, 3, 4)) == first
    assert block_hash(first, [5, 6, 7, 8]) != block_hash(None, [5, 6, 7, 8])
    assert block_hash(None, [1, 2, 3, 4], ("lora-1",)) != first
    # Digits joined into a string collide; a tuple of ints does not.
    assert "".join(map(str, [12, 3])) == "".join(map(str, [1, 23]))
    assert block_hash(None, [12, 3]) != block_hash(None, [1, 23])


def test_sha256_of_a_pickle_is_a_plain_value_the_same_for_equal_keys():
    """vLLM's sha256 option: equal keys pickle to equal bytes; the hex digest is a str."""
    key = lambda parent: (parent, (1, 2, 3, 4), ("salt", 7))
    digest = hashlib.sha256(pickle.dumps(key(None))).hexdigest()
    assert digest == hashlib.sha256(pickle.dumps(key(None))).hexdigest() and len(digest) == 64
    assert hashlib.sha256(pickle.dumps(key(digest))).hexdigest() != digest


def test_at_most_the_blocks_before_the_last_tokens_hit():
    """A prompt cached whole: (n - 1) // b blocks hit, a multiple of b tokens, for n a multiple of
    b or not; a partial last block never hits."""
    rng = np.random.default_rng(0)
    for n, b in ((16, 4), (18, 4), (17, 4), (5, 4), (4, 4), (1, 4), (64, 16)):
        cache, tokens = PrefixCache(64, b), [int(t) for t in rng.integers(0, 1000, n)]
        cache.allocate("first", tokens)
        blocks, cached = cache.allocate("again", tokens)
        assert cached == (n - 1) // b * b and len(blocks) == -(-n // b), (n, b)


def test_freed_blocks_join_the_tail_last_block_first():
    """A request's blocks, freed, are evicted last block first, after every block never used."""
    cache = PrefixCache(5, 2)
    blocks, _ = cache.allocate("a", [1, 2, 3, 4, 5, 6])
    cache.free("a")
    taken, _ = cache.allocate("b", [7, 8, 9, 10, 11, 12])
    assert taken[:2] == [b for b in range(5) if b not in blocks] and taken[2] == blocks[-1]
    # Only a's first two blocks still hold their hashes: a's prefix of 4 tokens hits.
    cache.free("b")
    assert cache.allocate("c", [1, 2, 3, 4, 0])[1] == 4


def test_the_trace_names_blocks_by_when_they_were_first_handed_out():
    t = streams(np.random.default_rng(1), s=8, u=4)
    ops = (request("a", t, ("s", 0, 8), ("u", 0, 1)), ("free", "a"), request("b", t, ("u", 0, 4), ("s", 0, 3)),
           ("free", "b"), request("c", t, ("s", 0, 8), ("u", 0, 2)), ("refcounts", "c"))
    assert cache_trace(PrefixCache, (4, 4), ops) == [[[0, 1, 2], 0], None, [[3, 2], 0], None,
                                                          [[0, 1, 2], 8], [1, 1, 1]]


def test_the_hash_facts_of_the_check_hold_for_the_reference():
    calls, facts = hash_case(np.random.default_rng(2))
    spec = tuple((parent, tuple(tokens), extra) for parent, tokens, extra in calls)
    assert hash_trace(block_hash, spec, tuple(f[:3] for f in facts)) == [int(f[2]) for f in facts]


# --- the grader on learners' files ------------------------------------------------------------

def test_a_correct_solution_passes(grade_source):
    result = grade_source("prefix-cache", SOLUTION, seed=4)
    assert result["score"] == result["max_score"], failed(result)


def test_a_hash_of_the_joined_digits_fails_the_hash_check_only(grade_source):
    source = edit("return hash((parent_hash, tuple(tokens), extra_keys))",
                  "return hash((parent_hash, ''.join(str(t) for t in tokens), extra_keys))")
    result = grade_source("prefix-cache", source)
    check = checks_by_id(result)["block-hash-chained"]
    assert failed(result) == ["block-hash-chained"] and "the same digits" in check["message"]


def test_a_sha256_digest_in_bytes_is_refused_with_a_sentence(grade_source):
    source = "import hashlib\nimport pickle\n" + edit(
        "return hash((parent_hash, tuple(tokens), extra_keys))",
        "return hashlib.sha256(pickle.dumps((parent_hash, tuple(tokens), extra_keys))).digest()")
    check = checks_by_id(grade_source("prefix-cache", source))["block-hash-chained"]
    assert check["status"] == "failed" and "an int or a str" in check["message"]


def test_allocate_that_returns_none_or_a_float_count(grade_source):
    for new in ("return None", "return blocks, float(len(hits) * bs)"):
        result = grade_source("prefix-cache", edit("return blocks, len(hits) * bs", new))
        check = checks_by_id(result)["hits-on-shared-prefix"]
        assert check["status"] == "failed" and "(block_ids, num_cached_tokens)" in check["message"], new


def test_an_allocate_that_raises_says_which_call(grade_source):
    source = edit("        bs, parent, hashes = self.bs, None, []\n",
                  "        bs, parent, hashes = self.bs, None, []\n        assert len(self.requests) < 3\n")
    check = checks_by_id(grade_source("prefix-cache", source))["hits-on-shared-prefix"]
    assert check["status"] == "failed" and "allocate('d'" in check["message"] and "AssertionError" in check["message"]


def test_a_missing_refcount_fails_the_checks_that_count(grade_source):
    source = edit("    def refcount(self, block_id):\n        return self.refs[block_id]\n", "")
    result = grade_source("prefix-cache", source)
    assert "refcount" in checks_by_id(result)["hits-on-shared-prefix"]["message"]
    assert checks_by_id(result)["block-hash-chained"]["status"] == "passed"


def test_a_free_that_forgets_the_hashes_is_named(grade_source):
    source = edit("""            if self.refs[b] == 0:
                self.queue.append(b)""", """            if self.refs[b] == 0:
                if self.hash_of[b] is not None:
                    del self.by_hash[self.hash_of[b]]
                    self.hash_of[b] = None
                self.queue.append(b)""")
    result = grade_source("prefix-cache", source)
    assert checks_by_id(result)["freed-blocks-stay-cached"]["diagnosis"] == "hash-dropped-on-free"
    assert checks_by_id(result)["hits-on-shared-prefix"]["status"] == "passed"


def test_a_cache_that_keeps_every_prompt_fails_only_the_memory_check(grade_source):
    source = edit("        self.requests[request_id] = blocks\n",
                  "        self.requests[request_id] = blocks\n        self.seen.append(list(tokens))\n")
    source = edit("        self.requests = {}\n", "        self.requests = {}\n        self.seen = []\n", source)
    assert failed(grade_source("prefix-cache", source)) == ["pool-never-grows"]
