"""Grader of the triton-paged-decode kata (katas/triton-paged-decode/README.md).

Every check builds a paged cache the way a server holds one: a pool of blocks, each sequence's
tokens in the blocks its row of the block table names, the rest of the pool (spare blocks, the
empty slots of each last block, the table's padding) filled with values 10 above the tokens',
so that a kernel reading one slot it should not moves its output by about 10. The values come
from the reference's kernel on the same pool; the structure checks read the recording of the
learner's launch: its grid, how often each cached element was read, and the launcher's torch calls.
"""
import numpy as np
import pytest
import torch

from graders.engine import expect, kernels, structure

AXES = ("batch", "head", "channel")
CALL = "paged_decode(q, k_cache, v_cache, block_table, seq_lens)"
POISON = 10.0   # added to every slot no token holds: a wrong read moves the output by O(10)

# The public cases: (B, Hkv, G, head_dim, block_size, seq_lens, spare blocks, shuffled table).
# Full blocks first; then lengths that end mid-block (and a sequence of one token); then a table
# whose physical ids are out of order, with spare blocks between the used ones.
FULL = (2, 2, 2, 16, 4, (8, 12), 1, False)
RAGGED = (3, 1, 2, 16, 4, (5, 11, 1), 1, False)
SHUFFLED = (2, 2, 2, 16, 4, (10, 15), 4, True)
STRIDED = (2, 2, 2, 16, 8, (9, 20), 2, True)
GROUPED = (2, 1, 3, 16, 4, (10, 15), 3, True)   # the structure check's: a group of 3 heads padded to 4 rows


def cdiv(n, d):
    return -(-n // d)


def drawn(rng, *shape) -> torch.Tensor:
    """float32 standard normal draws."""
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))


def paged_case(case_rng, rng, B, Hkv, G, D, block_size, seq_lens, spare, shuffled, strided=False):
    """(q, k_cache, v_cache, block_table, seq_lens) and the case's text. The structure (which
    physical block holds each logical block) comes from ``case_rng``, the values from ``rng``.
    With ``strided``, k_cache and v_cache are views kv[:, 0] and kv[:, 1] of one (num_blocks, 2,
    block_size, Hkv, D) tensor, and q a permuted view: none of them contiguous."""
    used = [cdiv(n, block_size) for n in seq_lens]
    max_blocks, num_blocks = max(used), sum(used) + spare
    ids = [int(i) for i in (case_rng.permutation(num_blocks) if shuffled else range(num_blocks))]
    table, free = [], ids[sum(used):]
    for b, n in enumerate(used):
        start = sum(used[:b])
        # past a sequence's last block the row is padding: ids of spare blocks, which no token holds
        table.append(ids[start:start + n] + [free[i % len(free)] for i in range(max_blocks - n)])
    block_table = torch.tensor(table, dtype=torch.int32)   # (B, max_blocks)

    held = torch.zeros(num_blocks, block_size, dtype=torch.bool)   # the slots a token holds
    for b, n in enumerate(seq_lens):
        for pos in range(n):
            held[table[b][pos // block_size], pos % block_size] = True
    poison = (~held).float()[:, :, None, None] * POISON   # (num_blocks, block_size, 1, 1)

    kv = drawn(rng, num_blocks, 2, block_size, Hkv, D)   # (num_blocks, 2, block_size, Hkv, D)
    kv = kv + torch.stack([poison, poison], dim=1)
    if strided:
        k_cache, v_cache = kv[:, 0], kv[:, 1]   # views: block stride 2 * block_size * Hkv * D
        q = drawn(rng, Hkv * G, B, D).permute(1, 0, 2)   # (B, Hq, D), strides (D, B * D, 1)
    else:
        k_cache, v_cache = kv[:, 0].clone(), kv[:, 1].clone()   # contiguous, each its own storage
        q = drawn(rng, B, Hkv * G, D)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    text = (f"B={B}, Hq={Hkv * G} query heads in groups of G={G} over Hkv={Hkv} KV heads, head_dim={D}, "
            f"block_size={block_size}, seq_lens={list(seq_lens)}, {num_blocks} blocks in the pool, "
            f"block_table={table}" + (", k_cache and v_cache views of one tensor, q a permuted view" if strided else "")
            + f"; every slot no token holds is {POISON:g} above the tokens' values, float32")
    return (q, k_cache, v_cache, block_table, lens), text


# The mistakes that change the values: the others compute the right answer in the wrong way.
VALUE_BUGS = ("block-offset-wrong", "last-block-unmasked", "kv-repeat-tiled", "no-scaling", "double-scale")


def judge(learner, bugs, kata, args, case):
    """paged_decode on ``args`` equals the reference's, to float32's tolerance."""
    got = learner.paged_decode(*args)
    tol = kata.tolerance("float32")
    expect.array(got, bugs.reference.paged_decode(*args), call=CALL, case=case, axes=AXES, **tol,
                 diagnose=lambda: bugs.match(got, lambda impl: impl.paged_decode(*args), among=VALUE_BUGS, **tol))


def test_matches_gathered_attention(learner, bugs, kata, case_rng, rng):
    """equals softmax(q k^T / sqrt(D)) v over each sequence's tokens, gathered through its block table"""
    judge(learner, bugs, kata, *paged_case(case_rng, rng, *FULL))


def test_lengths_end_mid_block(learner, bugs, kata, case_rng, rng):
    """sequences whose last block is partly filled (one of a single token): only the first seq_len slots are attended"""
    judge(learner, bugs, kata, *paged_case(case_rng, rng, *RAGGED))


def test_shuffled_block_table(learner, bugs, kata, case_rng, rng):
    """a block table whose physical ids are out of order, with spare blocks between them"""
    judge(learner, bugs, kata, *paged_case(case_rng, rng, *SHUFFLED))


def test_cache_strided_views(learner, bugs, kata, case_rng, rng):
    """k_cache and v_cache are views of one tensor, q a permuted view: every offset comes from the strides"""
    judge(learner, bugs, kata, *paged_case(case_rng, rng, *STRIDED, strided=True))


def test_group_shares_kv_loads(learner, bugs, kata, case_rng, rng):
    """one program per (sequence, KV head), grid (B, Hkv), groups of 3 heads: each cached key and value of the sequences is read once, each output written once"""
    args, case = paged_case(case_rng, rng, *GROUPED)
    B, Hkv, D, seq_lens = GROUPED[0], GROUPED[1], GROUPED[3], GROUPED[5]
    with learner.recording() as ops:
        got = learner.paged_decode(*args)
    launcher_plain(ops, case, args[1].numel())
    launched = kernels.launches(ops)
    grids = [op.get("grid") for op in launched]
    expect.that(len(launched) == 1 and grids[0] == [B, Hkv, 1],
                "Launch one kernel over the grid (B, Hkv): one program per sequence and KV head, holding the G "
                "query heads that share that KV head.", call=CALL, case=case,
                got=f"{len(launched)} launches, grids {grids}", expected=f"1 launch, grid ({B}, {Hkv}, 1)",
                diagnose=lambda: "kv-head-per-query-head" if any(programs(g) > B * Hkv for g in grids) else None)
    # The cache's two tensors, by their size (the kernel's names for them are the learner's).
    reads = launched[0].get("reads", {})
    caches = [name for name, summary in launched[0].get("args", {}).items() if numel(summary) == args[1].numel()]
    expect.that(len(caches) == 2, "Pass k_cache and v_cache to the kernel as they are, two tensor arguments.",
                call=CALL, case=case, got=f"{len(caches)} arguments of the cache's size",
                expected="k_cache and v_cache")
    tokens = sum(seq_lens) * Hkv * D   # the elements of the sequences' keys (and of their values)
    for name, what in zip(caches, ("k_cache", "v_cache")):
        most, distinct = reads.get(name, {}).get("most", 0), reads.get(name, {}).get("distinct", 0)
        expect.that(most <= 1, f"Some element of {what} is read {most} times in one step: one program must load "
                    "a KV head's keys and values once and use them for all G query heads of its group.",
                    call=CALL, case=case, got=f"an element read {most} times", expected="each read once",
                    diagnose=lambda: bugs.match(got, lambda impl: impl.paged_decode(*args), among=VALUE_BUGS,
                                                **kata.tolerance("float32")) or "kv-head-per-query-head")
        expect.that(distinct == tokens, f"Your kernel reads {distinct:,} elements of {what}: the sequences' "
                    f"tokens hold {tokens:,} (sum(seq_lens) * Hkv * head_dim). Read exactly the first seq_len "
                    "slots of each sequence, through its table.", call=CALL, case=case,
                    got=f"{distinct:,} distinct elements read", expected=f"{tokens:,}",
                    diagnose=lambda: bugs.match(got, lambda impl: impl.paged_decode(*args), among=VALUE_BUGS,
                                                **kata.tolerance("float32")))
    # Each output element written once: a padded row of the group stored unmasked lands on the next
    # group's first head (a race on a GPU, whose programs run in no set order) or past the tensor.
    written = sum(int(s.get("lanes", 0)) for s in launched[0].get("stores", {}).values())
    outside = kernels.outside(ops, "store") + kernels.outside(ops, "load")
    expect.that(written == args[0].numel() and not outside, "Store each output element once, and load and store "
                "nothing outside the tensors: mask the padded rows of the group (rows >= G) in the loads of q and in "
                "the store of out.", call=CALL, case=case,
                got=f"{written:,} elements stored, {outside:,} lanes outside the tensors",
                expected=f"{args[0].numel():,} stored (B * Hq * D), none outside")
    structure.check_untampered(learner, call=CALL, case=case)


def programs(grid) -> int:
    """Programs of a recorded grid (x, y, z)."""
    return int(np.prod(grid, dtype=np.int64)) if type(grid) is list else 0


def numel(summary) -> int:
    """Elements of a recorded tensor argument (0 for anything else)."""
    if type(summary) is not dict or type(summary.get("shape")) is not list:
        return 0
    return int(np.prod(summary["shape"], dtype=np.int64))


# What copies a tensor, or gathers from one: a paged kernel reads the pool where it is.
GATHERS = {"__getitem__", "index_select", "gather", "take", "take_along_dim", "cat", "concat", "concatenate",
           "stack", "clone", "copy_", "masked_select", "repeat_interleave", "index_copy", "index_put", "index_put_"}
COPIES = {"contiguous", "to", "reshape", "flatten", "unflatten"}   # a copy when the tensor is the cache's
INDEXING = {"long", "int", "arange"}   # what builds a gather's index: the gather is the mistake


def gather(op, cache_numel) -> bool:
    """Whether a recorded torch call copies the cache or gathers through an index: an index with
    a tensor (``k_cache[block_table]``, not ``q.shape[0]``), a gathering function, or a copy whose
    tensor is the cache's size."""
    name, args = op.get("name"), op.get("args") or [None]
    if name == "__getitem__":
        index = args[1] if len(args) > 1 else None
        return any(type(i) is dict and "shape" in i for i in (index if type(index) is list else [index]))
    return name in GATHERS or (name in COPIES and numel(args[0]) == cache_numel)


def launcher_plain(ops, case, cache_numel):
    """The launcher computes nothing with torch (launcher-computes), copies nothing out of the
    cache (gathers-in-launcher) and launches a kernel. The static check is left to the caller's end."""
    calls = kernels.launcher_calls(ops)
    # the arithmetic first: a launcher that attends with torch gathers too, and its mistake is the arithmetic
    arithmetic = sorted(set(calls) - kernels.LAUNCHER_FUNCTIONS - GATHERS - INDEXING)
    expect.that(not arithmetic, "Your launcher computes with torch: a launcher may allocate, read shapes and strides, "
                "take views and launch, and the kernel computes everything.", call=CALL, case=case,
                got=", ".join(arithmetic[:8]), expected="allocations, views and the launch only",
                diagnose=lambda: "launcher-computes")
    found = [op["name"] for op in ops if op.get("kind") == "function" and gather(op, cache_numel)]
    expect.that(not found, "Your launcher copies the cache or gathers from it: the copy costs as many bytes as the "
                "whole context again. Read k_cache and v_cache through the block table inside the kernel, where "
                "they are.", call=CALL, case=case, got=", ".join(str(n) for n in found[:8]),
                expected="allocations, views and the launch only", diagnose=lambda: "gathers-in-launcher")
    computed = sorted(set(calls) - kernels.LAUNCHER_FUNCTIONS)
    expect.that(bool(kernels.launches(ops)) and not computed, "Your launcher computes with torch (or launches no "
                "kernel): a launcher may allocate, read shapes and strides, take views and launch, and the kernel "
                "computes everything.", call=CALL, case=case, got=", ".join(computed[:8]) or "no launch",
                expected="allocations, views and a launch", diagnose=lambda: "launcher-computes")


def test_reads_cache_in_place(learner, bugs, kata, case_rng, rng):
    """the launcher makes no copy of the cache (no .contiguous(), no gather, no index with a tensor) and computes nothing: the kernel does it all"""
    args, case = paged_case(case_rng, rng, *RAGGED)
    with learner.recording() as ops:
        learner.paged_decode(*args)
    launcher_plain(ops, case, args[1].numel())
    kernels.check_kernels_compute(learner, ops, call=CALL, case=case, code="launcher-computes")


# The @cuda check's: a decode step of a server's size, compiled. (B, Hkv, G, head_dim, block_size,
# seq_lens, spare blocks, shuffled table)
COMPILED = (8, 2, 4, 64, 16, (1, 15, 16, 17, 100, 255, 256, 300), 8, True)


@pytest.mark.cuda
def test_compiled_on_cuda(learner, bugs, kata, case_rng, rng):
    """CUDA only: the kernel Triton compiles gives the interpreter's output on a decode step of eight sequences"""
    args, case = paged_case(case_rng, rng, *COMPILED)
    with learner.compiled() as gpu:
        got = gpu.paged_decode(*args)
    # Compiled, tl.dot on float32 blocks rounds its inputs to tf32 unless told otherwise (10
    # significant bits): the tolerance is float16's, whose rounding is alike.
    tol = kata.tolerance(torch.float16, expect.magnitude(args[2]))
    expect.array(got, bugs.reference.paged_decode(*args).cuda(), call=CALL + ", compiled", device="cuda",
                 case=case + ", on cuda", axes=AXES, **tol)
