"""A prefix cache of KV blocks, as vLLM V1 builds it: write `block_hash` and `PrefixCache` (README.md).

Only the bookkeeping: block ids, hashes, reference counts, in plain Python.
"""


def block_hash(parent_hash, tokens, extra_keys=None):
    """The hash of one full block: ``parent_hash`` (the previous block's hash, None for the first
    block), the block's ``tokens`` (a sequence of ints) and ``extra_keys`` (a tuple of ints and
    strings, or None). Equal inputs give equal hashes, and a different parent, token or extra key
    a different hash. Returns an int or a str (a sha256 hex digest will do)."""
    raise NotImplementedError("write block_hash")


class PrefixCache:
    """``num_blocks`` blocks of ``block_size`` tokens, shared across requests by the hashes of their
    full blocks.

    Every block starts in the free queue (any order); a freed block joins its tail, so the head is
    the least recently used block, and blocks never used are taken before any freed one. A block in
    the free queue may still hold a hash: it is a cache hit until it is taken for something else.
    """

    def __init__(self, num_blocks: int, block_size: int):
        """An empty cache: every block free, no hash cached."""
        raise NotImplementedError("write PrefixCache.__init__")

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
        raise NotImplementedError("write PrefixCache.allocate")

    def free(self, request_id) -> None:
        """The request is finished: each of its blocks loses a reference, and a block left with none
        joins the free queue's tail KEEPING its hash, the request's last block first, so that a
        request's tail (the longest prefix, the least likely to be asked again) is evicted first."""
        raise NotImplementedError("write PrefixCache.free")

    def refcount(self, block_id: int) -> int:
        """How many running requests hold block ``block_id``: 0 when it is in the free queue."""
        raise NotImplementedError("write PrefixCache.refcount")
