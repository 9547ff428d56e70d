"""Hidden checks of the spec-decode kata: fresh values at each grading, never in a student bundle."""
import math

import torch

from graders.engine import expect
from graders.spec_decode import B, H, HD, V, judge_greedy, normal, rotate, scripted_logits, tolerances, tree_text


def random_tree(case_rng, n):
    """A tree of n nodes, each node's parent drawn among the nodes before it, or the prefix."""
    return [int(case_rng.integers(-1, i)) for i in range(n)]


def tree_pass(impl, parents, prefix_len, q_raw, k_raw, v_raw):
    """The target's attention outputs at the N nodes, in one pass over the prefix and the tree with
    ``impl``'s mask and positions: (B, H, N, hd). RoPE makes each output depend on the positions."""
    mask = impl.tree_mask(parents, prefix_len)   # (N, P + N)
    positions = torch.cat([torch.arange(prefix_len), impl.tree_positions(parents, prefix_len)])   # (P + N,)
    q = rotate(q_raw, positions[prefix_len:])   # (B, H, N, hd)
    k = rotate(k_raw, positions)   # (B, H, P + N, hd)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(HD)).masked_fill(~mask, -math.inf)
    return torch.softmax(scores, dim=-1) @ v_raw


def test_fresh_tree_pass(learner, bugs, kata, case_rng, rng):
    """one target pass over a random tree gives each node the output of decoding its own branch"""
    tol, loose = tolerances(kata)
    for n in (7, 9):
        parents, prefix_len = random_tree(case_rng, n), int(case_rng.integers(1, 4))
        q_raw = normal(rng, B, H, n, HD)
        k_raw, v_raw = normal(rng, B, H, prefix_len + n, HD), normal(rng, B, H, prefix_len + n, HD)
        case = (f"{tree_text(parents, prefix_len)}; q, k, v: float64 ({B}, {H}, ·, {HD}), standard normal, "
                "q and k rotated (RoPE) at the positions tree_positions gives; scores masked by tree_mask")
        mask = learner.tree_mask(parents, prefix_len)
        expect.bool_mask(mask, (n, prefix_len + n), call=f"tree_mask({parents}, {prefix_len})", case=case)
        positions = learner.tree_positions(parents, prefix_len)
        expect.form(positions, torch.Tensor, (n,), dtype=torch.int64,
                    call=f"tree_positions({parents}, {prefix_len})", case=case)
        got = tree_pass(learner, parents, prefix_len, q_raw, k_raw, v_raw)
        expect.array(got, tree_pass(bugs.reference, parents, prefix_len, q_raw, k_raw, v_raw),
                     call="one target pass with tree_mask and tree_positions", case=case, **tol,
                     float32_inside=loose, what="the nodes' attention outputs",
                     against="each node's branch decoded alone", axes=("batch", "head", "node", "channel"),
                     diagnose=lambda: bugs.match(got, lambda impl: tree_pass(impl, parents, prefix_len, q_raw,
                                                                             k_raw, v_raw), **tol))


def test_fresh_greedy_walk(learner, bugs, case_rng, rng):
    """greedy verification of random trees, accepted to a leaf or stopped on the way"""
    for n in (8, 10):
        parents = random_tree(case_rng, n)
        tokens = [int(t) for t in case_rng.integers(0, V, size=n)]
        # The target's argmax after each row: most often one of the children's tokens, so the walk
        # goes deep; else any token, which may stop it.
        best = []
        for last in range(-1, n):
            children = [tokens[i] for i, p in enumerate(parents) if p == last]
            follow = children and case_rng.random() < 0.8
            best.append(int(case_rng.choice(children)) if follow else int(case_rng.integers(0, V)))
        logits = scripted_logits(rng, best, None)
        judge_greedy(learner, bugs, parents, tokens, logits,
                     f"parents = {parents}, tokens = {tokens}; the target's argmax after the prefix, then after "
                     f"each node: {best}")
