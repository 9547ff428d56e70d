"""Hidden checks of the flash-decoding kata: fresh values at each grading, never in a student bundle."""
import math

import torch

from graders.engine import expect
from graders.flash_decoding import (WHOLE_AGAINST, case_text, cut_text, inputs, judge_merge, judge_pair, judge_split,
                                    logsumexp, partials, sdpa, tensors)


# (H, H_kv): groups of 2 to 4 query heads over 2 to 4 KV heads, where h // n_rep and h % H_kv differ.
GROUPS = ((4, 2), (6, 2), (6, 3), (8, 2), (8, 4))


def fresh_shape(case_rng):
    """(B, H, H_kv, Tq, Tk, head_dim) drawn from case_rng: B != H != head_dim, one query or a few, a
    cache of 5 to 60 keys, KV groups of GROUPS."""
    H, Hkv = GROUPS[int(case_rng.integers(len(GROUPS)))]
    B = int(case_rng.choice([b for b in (2, 3, 4) if b != H]))
    hd = int(case_rng.choice([n for n in range(3, 11) if n != H]))
    return B, H, Hkv, int(case_rng.choice([1, 1, 2, 3])), int(case_rng.integers(5, 61)), hd


def fresh_cuts(case_rng, Tk, n):
    """n chunks of the Tk keys, cut at random points (none empty)."""
    return (0, *sorted(int(c) for c in case_rng.choice(range(1, Tk), size=n - 1, replace=False)), Tk)


def test_fresh_shapes_match_sdpa(learner, bugs, kata, case_rng, rng, device):
    """other shapes, KV groups and split counts: split_kv_decode equals SDPA, and merge_partials on another cut equals attention over all the keys"""
    B, H, Hkv, Tq, Tk, hd = fresh_shape(case_rng)
    q, k, v = inputs(rng, B, H, Tq, Tk, hd, Hkv=Hkv)
    for n in (int(case_rng.integers(2, Tk)), int(case_rng.integers(Tk + 1, 2 * Tk))):
        chunk = math.ceil(Tk / n)
        about = f"groups of {H // Hkv} query heads; splits of {chunk} keys, {n - math.ceil(Tk / chunk)} empty"
        judge_split(learner, bugs, kata, q, k, v, n, device=device,
                    case=case_text(B, H, Tq, Tk, hd, about=about, Hkv=Hkv))
    cuts = fresh_cuts(case_rng, Tk, int(case_rng.integers(2, min(Tk, 8))))
    outs, lses = partials(q, k, v, cuts, torch.float64)
    judge_merge(learner, bugs, kata, outs, lses, (sdpa(q, k, v), logsumexp(q, k)), call="merge_partials(outs, lses)",
                case=case_text(B, H, Tq, Tk, hd, about=cut_text(cuts), Hkv=Hkv), against=WHOLE_AGAINST, device=device)


def test_merges_compose(learner, bugs, kata, case_rng, rng, device):
    """merges compose: a tree of pairwise merges of the partials, in a shuffled order, equals attention over all the keys"""
    B, H, Hkv, Tq, Tk, hd = fresh_shape(case_rng)
    q, k, v = inputs(rng, B, H, Tq, Tk, hd, Hkv=Hkv)   # the partials of a grouped cache: the merge sees (B, H, Tq)
    cuts = fresh_cuts(case_rng, Tk, int(case_rng.integers(4, min(Tk, 9))))
    outs, lses = partials(q, k, v, cuts, torch.float64)
    order = [int(i) for i in case_rng.permutation(len(outs))]
    call = "merge_partials([out_a, out_b], [lse_a, lse_b]) on pairs, then on pairs of merged pairs"
    case = case_text(B, H, Tq, Tk, hd, about=cut_text(cuts) + f", merged pairwise in the order {order}", Hkv=Hkv)
    level = [(outs[i], lses[i]) for i in order]
    while len(level) > 1:   # one level of the tree: neighbours merged, an odd one out carried up
        merged_ = [learner.merge_partials([a[0], b[0]], [a[1], b[1]]) for a, b in zip(level[::2], level[1::2])]
        for got in merged_:
            tensors(got, call=call, case=case, name="merge_partials")   # the lse lets a merged pair merge again
        level = merged_ + level[len(merged_) * 2:]
    diagnose = lambda: bugs.match(level[0], lambda impl: tree(impl.merge_partials, outs, lses, order),   # noqa: E731
                                  **kata.tolerance("float32"))
    judge_pair(level[0], (sdpa(q, k, v), logsumexp(q, k)), call=call, case=case, name="merge_partials",
               against=WHOLE_AGAINST, tol=kata.tolerance("float64"), device=device, diagnose=diagnose,
               float32_inside=expect.float32_inside(kata))


def tree(merge, outs, lses, order):
    """The same tree of pairwise merges with a trusted merge."""
    level = [(outs[i], lses[i]) for i in order]
    while len(level) > 1:
        merged_ = [merge([a[0], b[0]], [a[1], b[1]]) for a, b in zip(level[::2], level[1::2])]
        level = merged_ + level[len(merged_) * 2:]
    return level[0]
