"""The ring-attention kata's facts, tested with the installed torch: the single-process attention
the grader compares with against F.scaled_dot_product_attention, the reference's ring (its ranks
simulated as threads) against it, the zig-zag layout and its balance, the merge's two forms; and
the grader on files written the way learners write them, run as real ranks in the sandbox: under
bubblewrap, and in a grading container's containment."""
import math
import os

import pytest
import torch
import torch.nn.functional as F

from conftest import checks_by_id
from graders.engine.learner import Learner
from graders.engine.manifest import ROOT
from graders.engine.sandbox import Sandbox, Zygote
from graders.ring_attention import simulate
from reference import ring_attention_bugs as bugs
from reference.ring_attention import ring_attention, zigzag_shard, zigzag_unshard
from reference.ring_attention_expected import attention

SOLUTION = (ROOT / "tests" / "zoo" / "ring-attention" / "einsum.py").read_text()
RETURN = "    return out.to(orig), lse.float()\n"


def drawn(seed, B=2, H=3, T=24, d=5):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, T, d, generator=g, dtype=torch.float64) for _ in range(3))


def sharded(x, world, zigzag):
    return [zigzag_shard(x, r, world, 2) for r in range(world)] if zigzag else list(x.chunk(world, dim=2))


def test_the_single_process_attention_agrees_with_sdpa_and_logsumexp():
    q, k, v = drawn(0)
    for causal in (False, True):
        out, lse = attention(q, k, v, causal)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal), rtol=1e-12,
                                   atol=1e-13)
        scores = q @ k.mT / math.sqrt(q.size(-1))
        if causal:
            scores = scores.masked_fill(~torch.ones(24, 24, dtype=torch.bool).tril(), float("-inf"))
        assert lse.dtype == torch.float32
        torch.testing.assert_close(lse, torch.logsumexp(scores, -1).float())
    # a query's lse at position 0 of a causal sequence is its one score: q0·k0 / sqrt(d)
    torch.testing.assert_close(lse[..., 0], (q[..., 0, :] * k[..., 0, :]).sum(-1).float() / math.sqrt(5))


@pytest.mark.parametrize("world", [2, 4])
def test_the_reference_ring_equals_the_single_process_attention_in_both_layouts(world):
    q, k, v = drawn(world)
    for causal in (False, True):
        out, lse = attention(q, k, v, causal)
        for zigzag in (False, True):
            got = simulate(ring_attention, sharded(q, world, zigzag), sharded(k, world, zigzag),
                           sharded(v, world, zigzag), causal, world, zigzag)
            for rank, (o, l) in enumerate(got):
                torch.testing.assert_close(o, sharded(out, world, zigzag)[rank], rtol=1e-12, atol=1e-13)
                torch.testing.assert_close(l, sharded(lse, world, zigzag)[rank])
            if zigzag:   # the layout undone gives the whole sequence's output
                torch.testing.assert_close(zigzag_unshard([o for o, _ in got], world, 2), out, rtol=1e-12,
                                           atol=1e-13)


def test_every_value_bug_oracle_is_wrong_on_the_public_cases_and_the_others_right():
    q, k, v = drawn(7)
    world = 2
    wrong = {}
    for code, variants in bugs.BUGS.items():
        for variant in variants if isinstance(variants, list) else [variants]:
            ring = variant["ring_attention"]
            for causal, zigzag in ((False, False), (True, False), (True, True)):
                out, _ = attention(q, k, v, causal)
                got = simulate(ring, sharded(q, world, zigzag), sharded(k, world, zigzag), sharded(v, world, zigzag),
                               causal, world, zigzag)
                if not torch.allclose(torch.cat([o for o, _ in got], 2), torch.cat(sharded(out, world, zigzag), 2)):
                    wrong.setdefault(code, set()).add((causal, zigzag))
    assert wrong["zigzag-order"] == {(True, True)}   # the layout matters only to a causal mask
    assert wrong["local-causal-offset"] == {(True, False), (True, True)}
    assert wrong["lse-not-rescaled"] == {(False, False), (True, False), (True, True)}
    assert "gathers-all-kv" not in wrong and "computes-masked-blocks" not in wrong   # right values: judged otherwise


def test_the_zigzag_layout_pairs_each_early_chunk_with_its_mirror():
    x = torch.arange(16)
    assert [zigzag_shard(x, r, 4, 0).tolist() for r in range(4)] == \
        [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]
    assert torch.equal(zigzag_unshard([zigzag_shard(x, r, 4, 0) for r in range(4)], 4, 0), x)
    y = torch.randn(3, 8, 2)
    assert torch.equal(zigzag_unshard([zigzag_shard(y, r, 2, -2) for r in range(2)], 2, -2), y)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_zigzag_gives_every_rank_the_same_causal_work_and_contiguous_r_plus_one_blocks(world):
    """The README's counts: rank r of the contiguous layout sees r full blocks and a triangle; in
    the zig-zag layout every rank sees as many (query, key) pairs."""
    T_local = 8
    T = world * T_local
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    pos = torch.arange(T)
    contiguous = [int(causal[r * T_local:(r + 1) * T_local].sum()) for r in range(world)]
    assert contiguous == [r * T_local ** 2 + T_local * (T_local + 1) // 2 for r in range(world)]
    zigzag = {int(causal[zigzag_shard(pos, r, world, 0)].sum()) for r in range(world)}
    assert zigzag == {T * (T + 1) // 2 // world}   # an equal share of the triangle on every rank


def test_ring_flash_attentions_sigmoid_merge_is_the_log_sum_exp_merge():
    g = torch.Generator().manual_seed(3)
    out, block_out = torch.randn(2, 4, 5, generator=g, dtype=torch.float64), torch.randn(2, 4, 5, generator=g,
                                                                                           dtype=torch.float64)
    lse, block_lse = torch.randn(2, 4, generator=g, dtype=torch.float64) * 30, torch.randn(2, 4, generator=g,
                                                                                              dtype=torch.float64) * 30
    new = torch.logaddexp(lse, block_lse)
    merged = torch.exp(lse - new)[..., None] * out + torch.exp(block_lse - new)[..., None] * block_out
    torch.testing.assert_close(out - torch.sigmoid(block_lse - lse)[..., None] * (out - block_out), merged)
    torch.testing.assert_close(lse - F.logsigmoid(lse - block_lse), new)


# --- the grader on learners' files, as real ranks -------------------------------------------------

def test_a_rank_that_keeps_every_chunk_it_received_fails_the_memory_check_as_gathers_all_kv(grade_source):
    """The acceptance's case: the ring run right, every chunk kept in a list and attended at the end.
    No collective shows it (only point-to-point sends), the memory does: 4 chunks at 4 ranks."""
    source = SOLUTION.replace("    for step in range(world_size):\n",
                              "    kept = []\n    for step in range(world_size):\n"
                              "        kept.append((k, v))   # every chunk, kept to the end\n")
    result = grade_source("ring-attention", source)
    checks = checks_by_id(result)
    assert checks["holds-two-chunks"]["diagnosis"] == "gathers-all-kv"
    assert "chunks of k and v more" in checks["holds-two-chunks"]["message"]
    assert result["diagnoses"] == ["gathers-all-kv"]
    assert result["score"] == result["max_score"] - 2


def test_a_ring_that_also_sends_at_its_last_step_is_counted(grade_source):
    """world_size transfers instead of world_size - 1: the last one sends each chunk home."""
    source = SOLUTION.replace("        if step < world_size - 1:\n            k_next",
                              "        if True:\n            k_next")
    source = source.replace("        if reqs:\n            k, v = k_next, v_next\n", "        k, v = k_next, v_next\n")
    checks = checks_by_id(grade_source("ring-attention", source))
    assert checks["ring-traffic"]["status"] == "failed"
    assert "chunks per rank" in checks["ring-traffic"]["message"]
    assert checks["matches-single-process"]["status"] == "passed"


def test_a_rank_that_raises_fails_the_checks_with_its_message(grade_source):
    source = SOLUTION.replace("    orig = q.dtype\n", "    orig = q.dtype\n    if rank == 1:\n"
                              "        raise RuntimeError('rank 1 ran out of memory')\n")
    checks = checks_by_id(grade_source("ring-attention", source))
    assert "rank 1 ran out of memory" in checks["matches-single-process"]["message"]
    assert checks["zigzag-shard-exact"]["status"] == "passed"


def test_nan_none_a_wrong_dtype_and_a_missing_function_are_reported(grade_source):
    nan = SOLUTION.replace(RETURN, "    return out * float('nan'), lse.float()\n")
    checks = checks_by_id(grade_source("ring-attention", nan))
    assert "NaN" in checks["matches-single-process"]["message"]
    double = SOLUTION.replace(RETURN, "    return out.to(orig), lse.double()\n")
    checks = checks_by_id(grade_source("ring-attention", double))
    assert "wrong dtype" in checks["matches-single-process"]["message"]
    assert "float32" in checks["matches-single-process"]["message"]
    source = SOLUTION.replace(RETURN, "    return None\n")
    source = source[:source.index("def zigzag_unshard")] + source[source.index("def global_positions"):]
    checks = checks_by_id(grade_source("ring-attention", source))
    assert "must return a pair" in checks["matches-single-process"]["message"]
    assert "zigzag_unshard" in checks["zigzag-shard-exact"]["message"]


def _ranks_run(tmp_path, zygote):
    """The reference run as 2 and 4 real ranks: every rank's (out, lse) against the single-process attention."""
    path = tmp_path / "ring_attention.py"
    path.write_text((ROOT / "reference" / "ring_attention.py").read_text())
    q, k, v = drawn(11, T=16)
    with Sandbox(path, zygote=zygote, framework="torch", module_name="ring_attention", timeout_s=10,
                 import_timeout_s=60, memory_mb=2048, spawn=False) as sandbox:
        learner = Learner(sandbox)
        for world in (2, 4):
            ranks = learner.ranks(world)
            for causal, zigzag in ((False, False), (True, True)):
                qs, ks, vs = (sharded(x, world, zigzag) for x in (q, k, v))
                got = ranks.each(lambda r, L: L.ring_attention(qs[r], ks[r], vs[r], causal, r, world, zigzag))
                out, lse = attention(q, k, v, causal)
                for rank, (o, l) in enumerate(got):
                    torch.testing.assert_close(o, sharded(out, world, zigzag)[rank], rtol=1e-12, atol=1e-13)
                    torch.testing.assert_close(l, sharded(lse, world, zigzag)[rank])


def test_the_ring_runs_at_2_and_4_ranks_under_bubblewrap(tmp_path, zygotes):
    zygote = zygotes("torch")
    if zygote.containment != "bwrap":
        pytest.skip("bubblewrap cannot make sandboxes here")
    _ranks_run(tmp_path, zygote)


def test_the_ring_runs_at_2_and_4_ranks_in_a_grading_containers_containment(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("container containment runs the worker as another user: root only")
    with Zygote(["torch"], isolated=False, container=True) as zygote:
        assert zygote.containment == "container"
        _ranks_run(tmp_path, zygote)
