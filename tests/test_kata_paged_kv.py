"""The paged-kv grader on solutions written the way learners write them (not via the bug oracles),
one failure path per check, and its trusted trace: the reference's answers to a script of appends,
forks and frees, which every check compares the learner's cache with."""
import numpy as np
import torch

from conftest import checks_by_id
from graders.paged_kv import (ALLOCATOR_OPS, Sequences, allocator_trace, appends, paged_trace, sdpa, tokens)
from reference.paged_kv import BlockAllocator, PagedKVCache, paged_attention

# Lists for the tables, a stack of free blocks, one token written at a time, attention by a loop
# over sequences with the KV heads repeated.
SOLUTION = '''
import math
import torch


class BlockAllocator:
    def __init__(self, num_blocks, block_size):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("sizes must be positive")
        self.free_ids = list(range(num_blocks))
        self.refs = [0] * num_blocks

    def allocate(self):
        if not self.free_ids:
            raise RuntimeError("pool full")
        b = self.free_ids.pop()
        self.refs[b] = 1
        return b

    def incref(self, block):
        self.refs[block] += 1

    def free(self, block):
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free_ids.append(block)

    def refcount(self, block):
        return self.refs[block]

    def num_free(self):
        return len(self.free_ids)


class PagedKVCache:
    def __init__(self, num_blocks, block_size, n_kv_heads, head_dim, dtype=torch.float32, device=None):
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.bs = block_size
        self.k = torch.zeros(num_blocks, block_size, n_kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros(num_blocks, block_size, n_kv_heads, head_dim, dtype=dtype, device=device)
        self.tables, self.lens = {}, {}

    def block_table(self, seq_id):
        return list(self.tables[seq_id])

    def seq_len(self, seq_id):
        return self.lens[seq_id]

    def append(self, seq_id, k, v):
        table = list(self.tables.get(seq_id, []))
        n = self.lens.get(seq_id, 0)
        need = -(-(n + k.shape[0]) // self.bs) - len(table)
        cow = n % self.bs != 0 and self.allocator.refcount(table[-1]) > 1
        if need + cow > self.allocator.num_free():
            raise RuntimeError("pool full")
        if cow:
            new = self.allocator.allocate()
            self.k[new], self.v[new] = self.k[table[-1]], self.v[table[-1]]
            self.allocator.free(table[-1])
            table[-1] = new
        for _ in range(need):
            table.append(self.allocator.allocate())
        for i in range(k.shape[0]):
            p = n + i
            self.k[table[p // self.bs], p % self.bs] = k[i]
            self.v[table[p // self.bs], p % self.bs] = v[i]
        self.tables[seq_id], self.lens[seq_id] = table, n + k.shape[0]

    def fork(self, src, dst):
        if dst in self.tables:
            raise ValueError("exists")
        for b in self.tables[src]:
            self.allocator.incref(b)
        self.tables[dst], self.lens[dst] = list(self.tables[src]), self.lens[src]

    def free(self, seq_id):
        for b in self.tables.pop(seq_id):
            self.allocator.free(b)
        del self.lens[seq_id]

    def gather(self, seq_id):
        pos = torch.arange(self.lens[seq_id])
        blocks = torch.tensor(self.tables[seq_id])[pos // self.bs]
        return self.k[blocks, pos % self.bs], self.v[blocks, pos % self.bs]


def paged_attention(q, cache, seq_ids):
    out = []
    for b, s in enumerate(seq_ids):
        k, v = cache.gather(s)
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1).to(q.dtype).transpose(0, 1)
        v = v.repeat_interleave(rep, dim=1).to(q.dtype).transpose(0, 1)
        w = (k @ q[b].unsqueeze(-1)).squeeze(-1) / math.sqrt(q.shape[-1])
        out.append((w.softmax(dim=-1).unsqueeze(1) @ v).squeeze(1))
    return torch.stack(out)
'''


def failed(result) -> list[str]:
    return [c["id"] for c in result["checks"] if c["status"] != "passed"]


def edit(old, new, source=SOLUTION):
    assert old in source, old
    return source.replace(old, new)


def test_the_trace_counts_blocks_and_reads_back_what_was_appended():
    rng = np.random.default_rng(0)
    ops = appends(rng, [(0, 5), (1, 3), (0, 4)], 2, 3) + [("gather", 0), ("blocks", 0), ("num_free",),
                                                           ("fork", 0, 2), ("refcounts", 2), ("same_table", 0, 2),
                                                           ("len", 2)]
    trace = paged_trace(PagedKVCache, paged_attention, (8, 4, 2, 3, "float64"), ops)
    seqs = Sequences()
    for op in ops[:3]:
        seqs.apply(op)
    assert torch.equal(trace[3][0], seqs.tokens(0)[0]) and torch.equal(trace[3][1], seqs.tokens(0)[1])
    assert trace[4:] == [3, 4, None, [2, 2, 2], 1, 9]


def test_the_library_oracle_agrees_with_the_reference_attention():
    rng = np.random.default_rng(1)
    for H, Hkv in ((3, 3), (4, 2), (6, 1)):
        cache, seqs = PagedKVCache(8, 3, Hkv, 4, torch.float64), Sequences()
        for op in appends(rng, [(0, 5), (1, 2), (0, 3), (2, 7)], Hkv, 4):
            cache.append(*op[1:])
            seqs.apply(op)
        q = torch.randn(3, H, 4, dtype=torch.float64)
        want = sdpa(q, {s: seqs.tokens(s) for s in (2, 0, 1)}, [2, 0, 1])
        torch.testing.assert_close(paged_attention(q, cache, [2, 0, 1]), want, rtol=1e-12, atol=1e-14)


def test_the_allocator_trace_of_the_reference():
    trace = allocator_trace(BlockAllocator, ALLOCATOR_OPS)
    assert "raised" not in trace and trace[7] == "RuntimeError" and trace[21] == 1


def test_a_correct_solution_passes(grade_source):
    result = grade_source("paged-kv", SOLUTION, seed=4)
    assert result["score"] == result["max_score"], failed(result)


def test_one_block_too_many_is_named_where_blocks_are_counted(grade_source):
    result = grade_source("paged-kv", edit("need = -(-(n + k.shape[0]) // self.bs) - len(table)",
                                           "need = (n + k.shape[0]) // self.bs + 1 - len(table)"))
    checks = checks_by_id(result)
    assert checks["blocks-held-are-ceil"]["diagnosis"] == "last-block-off-by-one"
    assert "ceil(L / block_size)" in checks["blocks-held-are-ceil"]["message"]
    for check in ("append-then-gather", "ragged-sequences-interleaved", "paged-attention-matches-sdpa"):
        assert checks[check]["status"] == "passed", check
    assert result["diagnoses"] == ["last-block-off-by-one"]


def test_a_gather_of_whole_blocks_is_named(grade_source):
    source = edit("""        pos = torch.arange(self.lens[seq_id])
        blocks = torch.tensor(self.tables[seq_id])[pos // self.bs]
        return self.k[blocks, pos % self.bs], self.v[blocks, pos % self.bs]""",
                  """        t = torch.tensor(self.tables[seq_id])
        return self.k[t].flatten(0, 1), self.v[t].flatten(0, 1)""")
    result = grade_source("paged-kv", source)
    check = checks_by_id(result)["append-then-gather"]
    assert check["diagnosis"] == "last-block-off-by-one"
    assert "wrong shape: the sequence holds 3 tokens" in check["message"]


def test_a_free_that_ignores_the_count_is_named(grade_source):
    result = grade_source("paged-kv", edit("""        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free_ids.append(block)""", """        self.refs[block] = 0
        self.free_ids.append(block)"""))
    checks = checks_by_id(result)
    assert checks["allocator-counts-references"]["diagnosis"] == "block-reused-while-referenced"
    assert checks["fork-shares-blocks"]["same_cause_as"] == "allocator-counts-references"
    assert result["diagnoses"] == ["block-reused-while-referenced"]


def test_a_fork_without_references_is_named(grade_source):
    result = grade_source("paged-kv", edit("""        for b in self.tables[src]:
            self.allocator.incref(b)
""", ""))
    checks = checks_by_id(result)
    assert checks["fork-shares-blocks"]["diagnosis"] == "block-reused-while-referenced"
    assert checks["allocator-counts-references"]["status"] == "passed"


def test_a_slot_from_a_cache_wide_count_is_named_only_when_sequences_interleave(grade_source):
    source = edit("""        for i in range(k.shape[0]):
            p = n + i
            self.k[table[p // self.bs], p % self.bs] = k[i]
            self.v[table[p // self.bs], p % self.bs] = v[i]""", """        for i in range(k.shape[0]):
            p = n + i
            self.k[table[p // self.bs], self.written % self.bs] = k[i]
            self.v[table[p // self.bs], self.written % self.bs] = v[i]
            self.written += 1""")
    source = edit("        self.tables, self.lens = {}, {}\n", "        self.tables, self.lens = {}, {}\n"
                  "        self.written = 0\n", source)
    result = grade_source("paged-kv", source)
    checks = checks_by_id(result)
    assert checks["append-then-gather"]["status"] == "passed"
    assert checks["ragged-sequences-interleaved"]["diagnosis"] == "slot-from-global-position"


def test_writing_the_shared_block_fails_only_copy_on_write(grade_source):
    result = grade_source("paged-kv", edit("cow = n % self.bs != 0 and", "cow = False and"))
    assert failed(result) == ["copy-on-write", "fresh-beam-forks"]
    assert checks_by_id(result)["copy-on-write"]["diagnosis"] == "shared-block-written-in-place"


def test_an_append_that_allocates_before_it_finds_the_pool_full(grade_source):
    """free-and-reuse: the blocks are taken one by one and the error comes when none is left: the
    append raises, but the blocks it took are lost."""
    source = edit("""        if need + cow > self.allocator.num_free():
            raise RuntimeError("pool full")
""", "")
    result = grade_source("paged-kv", source)
    check = checks_by_id(result)["free-and-reuse"]
    assert check["status"] == "failed"
    assert "num_free()" in check["message"]


def test_unscaled_attention_fails_only_the_attention_checks(grade_source):
    result = grade_source("paged-kv", edit(" / math.sqrt(q.shape[-1])", ""))
    assert failed(result) == ["paged-attention-matches-sdpa", "fresh-random-schedule", "fresh-beam-forks"]
    assert "F.scaled_dot_product_attention" in checks_by_id(result)["paged-attention-matches-sdpa"]["message"]


def test_nan_and_a_wrong_dtype_from_attention(grade_source):
    for new, words in (("return torch.stack(out) * float('nan')", "NaN"),
                       ("return torch.stack(out).double()", "wrong dtype")):
        result = grade_source("paged-kv", edit("return torch.stack(out)", new))
        check = checks_by_id(result)["paged-attention-matches-sdpa"]
        assert check["status"] == "failed" and words.lower() in check["message"].lower(), check["message"]


def test_a_gather_that_raises_says_which_call(grade_source):
    source = edit("        pos = torch.arange(self.lens[seq_id])\n",
                  "        pos = torch.arange(self.lens[seq_id])\n        assert len(self.tables) < 3\n")
    check = checks_by_id(grade_source("paged-kv", source))["ragged-sequences-interleaved"]
    assert check["status"] == "failed" and "gather" in check["message"]


def test_a_cache_that_keeps_each_sequence_contiguous_fails_only_the_memory_check(grade_source):
    """pool-never-grows: the pool is kept, but each sequence's keys are also concatenated into a
    tensor of their own, which gather returns: every value is right."""
    source = edit("        self.tables[seq_id], self.lens[seq_id] = table, n + k.shape[0]\n",
                  "        self.tables[seq_id], self.lens[seq_id] = table, n + k.shape[0]\n"
                  "        old = self.copies.get(seq_id, (k[:0], v[:0]))\n"
                  "        self.copies[seq_id] = (torch.cat([old[0], k]), torch.cat([old[1], v]))\n")
    source = edit("        self.tables, self.lens = {}, {}\n", "        self.tables, self.lens = {}, {}\n"
                  "        self.copies = {}\n", source)
    result = grade_source("paged-kv", source)
    assert failed(result) == ["pool-never-grows"]


def test_sdpa_fails_only_the_banned_api_check(grade_source):
    source = edit("""        w = (k @ q[b].unsqueeze(-1)).squeeze(-1) / math.sqrt(q.shape[-1])
        out.append((w.softmax(dim=-1).unsqueeze(1) @ v).squeeze(1))""",
                  """        y = torch.nn.functional.scaled_dot_product_attention(q[b].unsqueeze(1), k, v)
        out.append(y.squeeze(1))""")
    result = grade_source("paged-kv", source)
    assert failed(result) == ["banned-api"]
    assert result["diagnoses"] == ["banned-api"]


# --- issue 41 -----------------------------------------------------------------------------------

def test_kv_heads_tiled_by_repeat_are_named_the_same_at_every_seed(grade_source):
    """GQA's `.repeat` where `repeat_interleave` is meant: query head j reads KV head j % n_kv_heads.
    Every check whose draw has two KV heads or more and groups of two or more must show it, so the
    grade is the same at every seed."""
    source = edit("""        k = k.repeat_interleave(rep, dim=1).to(q.dtype).transpose(0, 1)
        v = v.repeat_interleave(rep, dim=1).to(q.dtype).transpose(0, 1)""",
                  """        k = k.repeat(1, rep, 1).to(q.dtype).transpose(0, 1)
        v = v.repeat(1, rep, 1).to(q.dtype).transpose(0, 1)""")
    grades = []
    for seed in (1, 2, 3):
        result = grade_source("paged-kv", source, seed=seed)
        assert checks_by_id(result)["paged-attention-matches-sdpa"]["diagnosis"] == "kv-repeat-tiled"
        assert result["diagnoses"] == ["kv-repeat-tiled"]
        grades.append((result["score"], failed(result)))
    assert grades[0][1] == ["paged-attention-matches-sdpa", "fresh-random-schedule", "fresh-beam-forks"]
    assert grades == [grades[0]] * 3


def test_free_ids_in_a_heapq_heap_are_plain_python(grade_source):
    """The README allows Python's plain helpers: a heap of free ids (the lowest id first) is one."""
    source = edit("import math\n", "import heapq\nimport math\n")
    source = edit("""        b = self.free_ids.pop()""", """        b = heapq.heappop(self.free_ids)""", source)
    source = edit("""            self.free_ids.append(block)""", """            heapq.heappush(self.free_ids, block)""", source)
    result = grade_source("paged-kv", source)
    assert result["score"] == result["max_score"], [(c["id"], c["message"]) for c in result["checks"]
                                                    if c["status"] != "passed"]


def test_a_slot_mapping_from_the_batch_token_index_is_named(grade_source):
    """vLLM's slot mapping, block_table[p // bs] * bs + p % bs, computed with p the token's index
    in everything the cache was given (a batch-wide position) instead of its position in its own
    sequence: right for one sequence alone."""
    source = edit("""        for i in range(k.shape[0]):
            p = n + i
            self.k[table[p // self.bs], p % self.bs] = k[i]
            self.v[table[p // self.bs], p % self.bs] = v[i]""", """        for i in range(k.shape[0]):
            p = self.batch_tokens + i
            slot = table[p // self.bs] * self.bs + p % self.bs
            self.k.view(-1, *self.k.shape[2:])[slot] = k[i]
            self.v.view(-1, *self.v.shape[2:])[slot] = v[i]
        self.batch_tokens += k.shape[0]""")
    source = edit("        self.tables, self.lens = {}, {}\n", "        self.tables, self.lens = {}, {}\n"
                  "        self.batch_tokens = 0\n", source)
    result = grade_source("paged-kv", source)
    checks = checks_by_id(result)
    assert checks["append-then-gather"]["status"] == "passed"
    assert checks["ragged-sequences-interleaved"]["diagnosis"] == "slot-from-global-position"


def test_a_fork_that_shares_the_table_list_is_named_for_it(grade_source):
    """fork hands dst src's own list, and append grows a table in place: one append changes both
    tables. The counts after the first wrong read (a copy was made: one block fewer free) tell it
    from a shared block written in place."""
    source = edit("        table = list(self.tables.get(seq_id, []))\n",
                  "        table = self.tables.get(seq_id, [])\n")
    source = edit("self.tables[dst], self.lens[dst] = list(self.tables[src]), self.lens[src]",
                  "self.tables[dst], self.lens[dst] = self.tables[src], self.lens[src]", source)
    result = grade_source("paged-kv", source)
    checks = checks_by_id(result)
    assert checks["copy-on-write"]["diagnosis"] == "fork-aliases-block-table"
    assert "shared-block-written-in-place" not in result["diagnoses"]
