"""What is specific to the spec-decode kata: the facts its README teaches (one tree pass equals
each branch decoded alone, rollback then decode equals a fresh decode, one speculative step emits
the target's distribution exactly), tested on the reference with torch, and the grader on
solutions written the way learners write them, one failure path per check."""
import math

import numpy as np
import pytest
import torch

from conftest import checks_by_id
from graders.spec_decode import BUSHY, decode, rotate, step_distribution, tree_cache
from graders.spec_decode_hidden import tree_pass
import reference.spec_decode as ref
from reference.spec_decode import (accept_greedy, accept_probability, residual, rollback, tree_mask,
                                   tree_positions)

# A learner's solution: ancestors by a while loop, depth by counting, the walk with argmax.
SOLUTION = '''
import torch


def tree_mask(parents, prefix_len):
    n = len(parents)
    mask = torch.zeros(n, prefix_len + n, dtype=torch.bool)
    mask[:, :prefix_len] = True
    for i in range(n):
        j = i
        while j != -1:
            mask[i, prefix_len + j] = True
            j = parents[j]
    return mask


def tree_positions(parents, prefix_len):
    depth = []
    for p in parents:
        depth.append(0 if p == -1 else depth[p] + 1)
    return torch.tensor(depth, dtype=torch.long) + prefix_len


def accept_greedy(tokens, parents, target_logits):
    best = target_logits.argmax(-1).tolist()
    path, node = [], -1
    while True:
        nxt = [i for i, p in enumerate(parents) if p == node and tokens[i] == best[node + 1]]
        if not nxt:
            return path, best[node + 1]
        node = nxt[0]
        path.append(node)


def accept_probability(p, q, token):
    return min(1.0, (p[token] / q[token]).item())


def residual(p, q):
    r = torch.clamp(p - q, min=0)
    if r.sum() == 0:
        return p.clone()
    return r / r.sum()


def rollback(cache, prefix_len, path):
    keep = list(range(prefix_len)) + [prefix_len + i for i in path]
    return cache[0][:, :, keep], cache[1][:, :, keep]
'''


def failed(result) -> list[str]:
    return [c["id"] for c in result["checks"] if c["status"] != "passed"]


def edit(old, new, source=SOLUTION):
    assert old in source, old
    return source.replace(old, new)


def branch(parents, i):
    """Node i's branch, root first."""
    nodes = []
    while i != -1:
        nodes.append(i)
        i = parents[i]
    return nodes[::-1]


def test_a_chain_gives_the_causal_mask_and_positions_in_a_row():
    for prefix_len in (0, 3):
        mask = tree_mask([-1, 0, 1, 2, 3], prefix_len)
        assert torch.equal(mask, torch.ones(5, prefix_len + 5, dtype=torch.bool).tril(prefix_len))
        assert tree_positions([-1, 0, 1, 2, 3], prefix_len).tolist() == list(range(prefix_len, prefix_len + 5))


def test_one_tree_pass_equals_each_branch_decoded_alone():
    """The README's claim: with the tree mask and positions by depth, node i's output in one pass
    is the last output of a causal pass over the prefix and node i's branch alone."""
    g = torch.Generator().manual_seed(0)
    parents, P = BUSHY, 3
    n = len(parents)
    q, k, v = (torch.randn(2, 2, P + n, 4, generator=g, dtype=torch.float64) for _ in range(3))
    out = tree_pass(ref, parents, P, q[:, :, P:], k, v)   # (B, H, N, hd)
    for i in range(n):
        rows = list(range(P)) + [P + j for j in branch(parents, i)]
        T = len(rows)
        qb, kb = rotate(q[:, :, rows], torch.arange(T)), rotate(k[:, :, rows], torch.arange(T))
        scores = (qb @ kb.transpose(-2, -1) / math.sqrt(4)).masked_fill(
            ~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
        alone = torch.softmax(scores, dim=-1) @ v[:, :, rows]
        torch.testing.assert_close(out[:, :, i], alone[:, :, -1], rtol=1e-12, atol=1e-12)


def test_rollback_then_decode_equals_a_fresh_decode():
    g = torch.Generator().manual_seed(1)
    parents, P, path = BUSHY, 3, [1, 4, 7]
    k_raw, v_raw = (torch.randn(2, 2, P + len(parents), 4, generator=g, dtype=torch.float64) for _ in range(2))
    new = [torch.randn(2, 2, 1, 4, generator=g, dtype=torch.float64) for _ in range(3)]
    cache = rollback(tree_cache(k_raw, v_raw, P, tree_positions(parents, P)), P, path)
    rows = list(range(P)) + [P + i for i in path]
    fresh = (rotate(k_raw[:, :, rows], torch.arange(len(rows))), v_raw[:, :, rows])
    torch.testing.assert_close(decode(cache, *new), decode(fresh, *new), rtol=1e-12, atol=1e-12)
    # positions by index put node 7 six places too far: the same gather no longer equals it
    wrong = rollback(tree_cache(k_raw, v_raw, P, P + torch.arange(len(parents))), P, path)
    assert not torch.allclose(decode(wrong, *new), decode(fresh, *new))


def test_one_step_emits_the_target_distribution_for_any_draft():
    rng = np.random.default_rng(2)
    for _ in range(20):
        p, q = (torch.softmax(torch.from_numpy(rng.standard_normal(7) * 2), 0) for _ in range(2))
        q[rng.integers(7)] = 0.0   # a token the draft never proposes
        q = q / q.sum()
        torch.testing.assert_close(step_distribution(ref, p, q), p, rtol=1e-12, atol=1e-14)
    p = torch.softmax(torch.from_numpy(rng.standard_normal(5)), 0)
    assert torch.equal(residual(p, p.clone()), p)   # p == q: nothing rejected, the residual is p


def test_sampling_one_step_follows_p():
    """The same claim by sampling, as a serving engine runs it: draft x ~ q, keep it if u < accept,
    else draw from the residual."""
    g = torch.Generator().manual_seed(3)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    q = torch.tensor([0.1, 0.6, 0.1, 0.2], dtype=torch.float64)
    n = 200_000
    x = torch.multinomial(q, n, replacement=True, generator=g)
    keep = torch.rand(n, generator=g, dtype=torch.float64) < torch.clamp(p[x] / q[x], max=1.0)
    redraw = torch.multinomial(residual(p, q), n, replacement=True, generator=g)
    emitted = torch.where(keep, x, redraw)
    freq = torch.bincount(emitted, minlength=4).double() / n
    assert torch.allclose(freq, p, atol=0.005)
    assert accept_probability(p, q, 0) == 1.0 and accept_probability(p, q, 1) == 0.5


def test_multinomial_normalises_an_unnormalised_residual_silently():
    """residual-not-normalised's explanation: a sampler hides the missing division, the law does not."""
    g = torch.Generator().manual_seed(4)
    excess = torch.tensor([0.3, 0.0, 0.1], dtype=torch.float64)   # sums to 0.4, a rejection probability
    draws = torch.multinomial(excess, 40_000, replacement=True, generator=g)
    assert abs(float((draws == 0).double().mean()) - 0.75) < 0.01 and not (draws == 1).any()


def test_argmax_breaks_ties_towards_the_first_index():
    assert int(torch.tensor([0.0, 2.0, 1.0, 2.0]).argmax()) == 1
    logits = torch.zeros(3, 4)   # after the prefix, after node 0, after node 1
    logits[0, [1, 3]] = 1.0   # the target is torn between tokens 1 and 3: token 1 it is
    assert accept_greedy([3, 1], [-1, -1], logits) == ([1], 0)


def test_the_bonus_token_comes_after_a_leaf_too():
    logits = torch.zeros(4, 5)
    for row, best in enumerate([2, 4, 1, 3]):
        logits[row, best] = 1.0
    assert accept_greedy([2, 4, 1], [-1, 0, 1], logits) == ([0, 1, 2], 3)   # all 3 accepted, 4 tokens
    assert accept_greedy([0, 4, 1], [-1, 0, 1], logits) == ([], 2)          # none accepted, 1 token


def test_a_correct_solution_passes(grade_source):
    result = grade_source("spec-decode", SOLUTION, seed=4)
    assert result["score"] == result["max_score"], failed(result)


def test_a_float_mask_int32_positions_and_a_missing_function(grade_source):
    source = edit("    mask = torch.zeros(n, prefix_len + n, dtype=torch.bool)\n",
                  "    mask = torch.zeros(n, prefix_len + n)\n")
    source = edit("dtype=torch.long) + prefix_len", "dtype=torch.int32) + prefix_len", source)
    source = edit("def accept_greedy(", "def greedy_accept(", source)
    checks = checks_by_id(grade_source("spec-decode", source))
    assert "bool" in checks["chain-is-causal"]["message"] and checks["tree-mask"]["status"] == "failed"
    assert "wrong dtype" in checks["positions-by-depth"]["message"]
    assert "int32" in checks["rollback-then-decode"]["message"]
    assert "accept_greedy" in checks["greedy-acceptance"]["message"]
    assert checks["fresh-greedy-walk"]["status"] == "failed"
    assert checks["accept-probability"]["status"] == "passed" and checks["residual"]["status"] == "passed"


def test_a_tensor_from_min_a_nan_residual_and_no_rollback(grade_source):
    """min(1.0, p / q) is a tensor whenever the ratio is below 1; 0 / 0 where p == q is NaN; a
    rollback that returns nothing."""
    source = edit("return min(1.0, (p[token] / q[token]).item())", "return min(1.0, p[token] / q[token])")
    source = edit("    if r.sum() == 0:\n        return p.clone()\n", "", source)
    source = edit("    return cache[0][:, :, keep], cache[1][:, :, keep]", "    cache = None", source)
    result = grade_source("spec-decode", source)
    checks = checks_by_id(result)
    for check in ("accept-probability", "step-gives-target"):
        assert "wrong type" in checks[check]["message"] and "float" in checks[check]["message"], check
    assert "NaN" in checks["residual"]["message"] and checks["residual"]["diagnosis"] is None
    assert "wrong type" in checks["rollback-then-decode"]["message"]
    assert failed(result) == ["accept-probability", "residual", "step-gives-target", "rollback-then-decode"]


@pytest.mark.parametrize("old,new,code,lost", [
    ("        j = i\n        while j != -1:\n            mask[i, prefix_len + j] = True\n            j = parents[j]\n",
     "        mask[i, prefix_len:prefix_len + i + 1] = True   # the nodes written before it\n",
     "siblings-see-each-other", ["tree-mask", "fresh-tree-pass"]),
    ("return path, best[node + 1]", "return path, (None if node != -1 and node not in parents else best[node + 1])",
     "bonus-token-missing",
     ["greedy-acceptance", "fresh-greedy-walk"]),
])
def test_mistakes_written_by_hand_are_named(grade_source, old, new, code, lost):
    result = grade_source("spec-decode", edit(old, new))
    assert result["diagnoses"] == [code] and failed(result) == lost
