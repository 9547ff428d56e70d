"""What is specific to the triton-paged-decode kata: the facts its README teaches, checked on the
installed torch and Triton (its interpreter), and failure paths graded through grade_source."""
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import checks_by_id
from graders.triton_paged_decode import FULL, POISON, RAGGED, SHUFFLED, STRIDED, paged_case
from reference.triton_paged_decode import paged_decode
from reference.triton_paged_decode_bugs import last_block_unmasked, strides_from_shape

ZOO = Path(__file__).parent / "zoo" / "triton-paged-decode"
FRESH = (2, 2, 3, 8, 8, (7, 17), 2, True)   # the hidden check's shapes: G = 3, head_dim 8, blocks of 8


def gathered_attention(q, k_cache, v_cache, block_table, seq_lens):
    """The README's contract in float64: each sequence's tokens gathered through its table."""
    B, Hq, D = q.shape
    block_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty(B, Hq, D, dtype=torch.float64)
    for b in range(B):
        pos = torch.arange(int(seq_lens[b]))
        blocks = block_table[b].long()[pos // block_size]
        k = k_cache[blocks, pos % block_size].double().repeat_interleave(Hq // Hkv, dim=1)   # (L, Hq, D)
        v = v_cache[blocks, pos % block_size].double().repeat_interleave(Hq // Hkv, dim=1)
        p = torch.softmax(torch.einsum("hd,lhd->hl", q[b].double(), k) / math.sqrt(D), dim=-1)
        out[b] = torch.einsum("hl,lhd->hd", p, v)
    return out


def case(shape, seed=0, strided=False):
    return paged_case(np.random.default_rng(1), np.random.default_rng(seed), *shape, strided=strided)[0]


@pytest.mark.parametrize("shape, strided", [(FULL, False), (RAGGED, False), (SHUFFLED, False), (STRIDED, True),
                                            (FRESH, False)])
def test_the_reference_is_attention_over_the_gathered_tokens(shape, strided):
    """The kernel equals softmax(q k^T / sqrt(D)) v over each sequence's seq_len tokens, found
    through its table, to float32 rounding: full blocks, partial last blocks, a shuffled table,
    strided views and a group of 3 heads."""
    args = case(shape, strided=strided)
    out = paged_decode(*args)
    assert out.dtype == torch.float32 and out.shape == args[0].shape
    assert (out.double() - gathered_attention(*args)).abs().max() < 1e-6


def test_a_wrong_slot_moves_the_output_by_about_the_poison():
    """Every slot no token holds is POISON above the tokens: attending the empty end of the last
    block, or reading a view's blocks at the contiguous stride, moves outputs by O(1) or more."""
    ragged = case(RAGGED)
    assert (last_block_unmasked(*ragged) - paged_decode(*ragged)).abs().max() > POISON / 4
    strided = case(STRIDED, strided=True)
    assert not strided[1].is_contiguous() and not strided[0].is_contiguous()
    assert (strides_from_shape(*strided) - paged_decode(*strided)).abs().max() > 0.5


def test_the_zoo_differs_from_the_reference_by_a_few_ulps():
    """The tolerance's measure (kata.toml): the style zoo's kernels (tl.dot, exp2, a token at a
    time) differ from the reference by less than 1e-6 on outputs of O(1)."""
    for path in sorted(ZOO.glob("*.py")):
        if "__" in path.stem:
            continue
        spec = importlib.util.spec_from_file_location(f"zoo_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for shape, strided in ((SHUFFLED, False), (FRESH, False)):
            args = case(shape, seed=3, strided=strided)
            assert (module.paged_decode(*args) - paged_decode(*args)).abs().max() < 1e-6, path.stem


def test_the_last_block_wastes_ceil_slots():
    """A sequence of L tokens holds ceil(L / block_size) blocks: the last-block-waste follow-up."""
    for L, bs in ((1003, 16), (2050, 32), (4097, 16)):
        blocks = torch.unique(torch.arange(L) // bs).numel()
        assert blocks * bs - L == -(-L // bs) * bs - L and 0 <= blocks * bs - L < bs


REFERENCE = (Path(__file__).parents[1] / "reference" / "triton_paged_decode.py").read_text()


def edit(old, new, source):
    assert old in source, old
    return source.replace(old, new)


def test_broken_launchers_fail_each_check_with_its_own_sentence(grade_source):
    """One file, a different failure per case (picked by the shapes): a wrong shape on full blocks,
    it raises on the shuffled table, returns None on the ragged lengths, float64 on the strided
    views and NaN on the hidden shapes. No failure is put down to a known mistake but the launch
    that never happened."""
    source = edit("    out = torch.empty_like(q)   # (B, Hq, D)\n",
                  "    if D == 8:\n"
                  "        return torch.full_like(q, float('nan'))\n"
                  "    if num_blocks == 6:\n"
                  "        return torch.empty(B, Hq, D + 1)\n"
                  "    if num_blocks >= 10:\n"
                  "        raise ValueError('no table today')\n"
                  "    if B == 3:\n"
                  "        return None\n"
                  "    out = torch.empty_like(q) if block_size == 4 else torch.empty(q.shape, dtype=torch.float64)\n",
                  REFERENCE)
    checks = checks_by_id(grade_source("triton-paged-decode", source, seed=2))
    assert "shape" in checks["matches-gathered-attention"]["message"]
    assert "ValueError" in checks["shuffled-block-table"]["message"]
    assert "ValueError" in checks["group-shares-kv-loads"]["message"]
    assert "wrong type" in checks["lengths-end-mid-block"]["message"]
    assert "dtype" in checks["cache-strided-views"]["message"]
    assert "nan" in checks["fresh-shapes"]["message"].lower()
    # the ragged case returned None without a launch: the structure check on it says so
    assert "launches no kernel" in checks["reads-cache-in-place"]["message"]
    assert {i: c["diagnosis"] for i, c in checks.items() if c["diagnosis"]} == {"reads-cache-in-place": "launcher-computes"}


def test_a_launcher_that_attends_with_torch_fails_the_structure_checks(grade_source):
    """The launcher computes the attention with torch and a kernel copies it out: every value
    check passes, both structure checks fail, diagnosed launcher-computes."""
    source = REFERENCE + '''

@triton.jit
def _copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def paged_decode(q, k_cache, v_cache, block_table, seq_lens):
    B, Hq, D = q.shape
    block_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    answer = torch.empty_like(q)
    for b in range(B):
        k = k_cache[block_table[b]].flatten(0, 1)[: seq_lens[b]]   # (L, Hkv, D)
        v = v_cache[block_table[b]].flatten(0, 1)[: seq_lens[b]]
        for h in range(Hq):
            p = (k[:, h // (Hq // Hkv)] @ q[b, h] / math.sqrt(D)).softmax(0)
            answer[b, h] = p @ v[:, h // (Hq // Hkv)]
    out = torch.empty_like(q)
    _copy_kernel[(triton.cdiv(q.numel(), 64),)](answer, out, q.numel(), BLOCK=64)
    return out
'''
    checks = checks_by_id(grade_source("triton-paged-decode", source, seed=2))
    failed = {i: c["diagnosis"] for i, c in checks.items() if c["status"] == "failed"}
    assert failed == {"reads-cache-in-place": "launcher-computes", "group-shares-kv-loads": "launcher-computes"}


def test_a_missing_function_fails_every_check(grade_source):
    source = edit("def paged_decode(", "def paged_decode_v2(", REFERENCE)
    result = grade_source("triton-paged-decode", source, seed=2)
    assert all(c["status"] != "passed" and "paged_decode" in c["message"]
               for c in result["checks"] if c["status"] != "skipped")   # the CUDA check, without a GPU
