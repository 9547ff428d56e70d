"""Grader of the spec-decode kata (katas/spec-decode/README.md)."""
import math

import torch

from graders.engine import expect

# Draft trees as parents lists, each with its prefix length. A chain is one branch: its mask is the
# causal mask and its positions count its nodes, so the mistakes that treat a tree as a sequence
# (a causal mask over the nodes, positions by node index) pass on it and fail on the trees.
CHAINS = (([-1, 0, 1, 2], 3), ([-1, 0, 1, 2, 3, 4], 0), ([-1], 5))
# The trees: two roots with one to three children each (Medusa's and EAGLE's shape), four
# siblings alone (the top-4 candidates of one next token), an uneven tree after a prefix of one.
TREES = (([-1, -1, 0, 0, 1, 2, 2, 4], 3), ([-1, -1, -1, -1], 2), ([-1, 0, 0, 1, -1, 3], 1))
BUSHY = TREES[0][0]
AXES = ("node", "key")
B, H, HD = 2, 2, 4   # the cache's batch, heads and head_dim; H != head_dim
ROPE_BASE = 100.0    # two frequencies, 1 and 0.1 rad per position, over head_dim 4


def tree_text(parents, prefix_len) -> str:
    return f"parents = {parents}, prefix_len = {prefix_len}"


def normal(rng, *shape):
    return torch.from_numpy(rng.standard_normal(shape))   # float64


def judge_mask(learner, bugs, parents, prefix_len, case):
    call = f"tree_mask({parents}, {prefix_len})"
    got = learner.tree_mask(parents, prefix_len)
    expected = bugs.reference.tree_mask(parents, prefix_len)   # (N, P + N)
    expect.bool_mask(got, tuple(expected.shape), call=call, case=case)
    expect.array(got, expected, call=call, case=case, what="the mask", against="the tree's mask", axes=AXES,
                 rtol=0.0, atol=0.0,
                 diagnose=lambda: bugs.match(got, lambda impl: impl.tree_mask(parents, prefix_len), rtol=0, atol=0))


def judge_positions(learner, bugs, parents, prefix_len, case):
    call = f"tree_positions({parents}, {prefix_len})"
    got = learner.tree_positions(parents, prefix_len)
    expect.array(got, bugs.reference.tree_positions(parents, prefix_len), call=call, case=case,
                 what="the positions", against="prefix_len + depth", axes=("node",), rtol=0.0, atol=0.0,
                 diagnose=lambda: bugs.match(got, lambda impl: impl.tree_positions(parents, prefix_len),
                                             rtol=0, atol=0))


def test_chain_is_causal(learner, bugs):
    """a chain's mask is the causal mask: the prefix, then the lower triangle"""
    for parents, prefix_len in CHAINS:
        judge_mask(learner, bugs, parents, prefix_len, tree_text(parents, prefix_len) +
                   ": a chain, node i sees the prefix and nodes 0..i")


def test_tree_mask(learner, bugs):
    """a tree's mask: each node sees the prefix, its ancestors and itself, never its siblings"""
    for parents, prefix_len in TREES:
        judge_mask(learner, bugs, parents, prefix_len, tree_text(parents, prefix_len) +
                   "; row i: node i, columns: the prefix then the nodes")


def test_positions_by_depth(learner, bugs):
    """positions are prefix_len + depth, on chains and trees"""
    for parents, prefix_len in CHAINS[:1] + TREES:
        judge_positions(learner, bugs, parents, prefix_len, tree_text(parents, prefix_len) +
                        "; a child of the prefix is at depth 0")


# --- greedy verification --------------------------------------------------------------------------

V = 8   # the vocabulary of the scripted logits
# (parents, tokens, the target's argmax after the prefix and after each node): a rejection after
# three accepted nodes of a chain; the bushy tree walked to a leaf (the bonus is the argmax after
# it); the same tree rejected at once (no root is the argmax); siblings with a tie in the
# target's logits, which torch.argmax breaks towards the first index.
GREEDY = (
    ([-1, 0, 1, 2], [4, 4, 2, 6], [4, 4, 2, 0, 3], None),
    (BUSHY, [5, 3, 2, 7, 1, 4, 6, 0], [5, 2, 0, 6, 4, 2, 7, 1, 3], None),
    (BUSHY, [5, 3, 2, 7, 1, 4, 6, 0], [1, 2, 0, 6, 4, 2, 7, 1, 3], None),
    ([-1, -1, -1], [6, 2, 5], [2, 0, 7, 4], (0, 6)),   # row 0: logits tied at tokens 2 and 6
)


def scripted_logits(rng, best, tie):
    """(N + 1, V) float64 logits whose argmax in row r is best[r]: drawn, then that entry raised
    above the rest. ``tie`` (row, token): that token gets the row's largest value too."""
    logits = normal(rng, len(best), V)   # (N + 1, V)
    for r, t in enumerate(best):
        logits[r, t] = logits[r].max() + 0.5 + float(rng.random())
    if tie is not None:
        logits[tie[0], tie[1]] = logits[tie[0]].max()
    return logits


def greedy_text(parents, tokens, best, tie) -> str:
    text = f"parents = {parents}, tokens = {tokens}; the target's argmax after the prefix, then after each node: {best}"
    return text + (f" (row {tie[0]} tied at tokens {best[tie[0]]} and {tie[1]})" if tie else "")


def judge_greedy(learner, bugs, parents, tokens, logits, case):
    call = f"accept_greedy({tokens}, {parents}, target_logits)"
    got = learner.accept_greedy(tokens, parents, logits)
    path, bonus = bugs.reference.accept_greedy(tokens, parents, logits)
    diagnose = lambda: bugs.match(got, lambda impl: impl.accept_greedy(tokens, parents, logits), rtol=0, atol=0)
    expect.type_of(got, tuple, call=call, case=case)
    expect.that(len(got) == 2, "accept_greedy must return a pair (path, bonus_token).", call=call, case=case,
                got=f"a tuple of {len(got)}", expected="(path, bonus_token)")
    got_path, got_bonus = got
    expect.that(type(got_path) is list and all(type(i) is int for i in got_path),
                "The path must be a list of Python ints, the accepted nodes' indices.", call=call, case=case,
                got=expect.describe_value(got_path), expected=str(path), diagnose=diagnose)
    expect.that(got_path == path, "The accepted path is wrong.", call=call, case=case,
                got=str(got_path), expected=str(path), diagnose=diagnose)
    bonus_text = ("it is the target's argmax after the last accepted node (after the prefix when none is "
                  "accepted), one token more than the accepted ones")
    expect.that(type(got_bonus) is int, f"The bonus token must be a Python int: {bonus_text}.", call=call,
                case=case, got=expect.describe_value(got_bonus), expected=f"int {bonus}", diagnose=diagnose)
    expect.that(got_bonus == bonus, f"The bonus token is wrong: {bonus_text}.", call=call, case=case,
                got=str(got_bonus), expected=str(bonus), diagnose=diagnose)


def test_greedy_acceptance(learner, bugs, rng):
    """greedy verification walks the tree along the target's argmax, and adds the bonus token"""
    for parents, tokens, best, tie in GREEDY:
        logits = scripted_logits(rng, best, tie)
        judge_greedy(learner, bugs, parents, tokens, logits, greedy_text(parents, tokens, best, tie))


# --- sampled verification -------------------------------------------------------------------------

# Distributions over 6 tokens: the indices where p (the target's) and q (the draft's) are 0.
# The draft never proposes a token where q is 0; the target never emits one where p is 0.
DISTRIBUTIONS = (((), ()), ((1, 4), ()), ((), (0, 5)), ((2,), (2, 3)))
TOKENS = 6


def distribution(rng, zeros):
    """A random distribution over TOKENS tokens, 0 at ``zeros``: a softmax of normals, float64 (V,)."""
    x = normal(rng, TOKENS)
    x[list(zeros)] = -math.inf
    return torch.softmax(x, dim=0)


def pq_text(p_zeros, q_zeros) -> str:
    text = "p, q: float64 (6,), random distributions"
    zeros = [f"p[{i}] = 0" for i in p_zeros] + [f"q[{i}] = 0" for i in q_zeros]
    return text + (f" with {', '.join(zeros)}" if zeros else "")


def tolerances(kata):
    return kata.tolerance("float64"), expect.float32_inside(kata)


def test_accept_probability(learner, bugs, kata, rng):
    """the acceptance probability is min(1, p[x] / q[x]), a Python float"""
    tol, loose = tolerances(kata)
    for p_zeros, q_zeros in DISTRIBUTIONS[:3]:
        p, q = distribution(rng, p_zeros), distribution(rng, q_zeros)
        for token in range(TOKENS):
            if token in q_zeros:
                continue   # the draft never proposes it
            call, case = f"accept_probability(p, q, {token})", pq_text(p_zeros, q_zeros)
            got = learner.accept_probability(p, q, token)
            expect.type_of(got, float, call=call, case=case)
            expect.values(got, bugs.reference.accept_probability(p, q, token), call=call, case=case, **tol,
                          float32_inside=loose,
                          diagnose=lambda: bugs.match(got, lambda impl: impl.accept_probability(p, q, token), **tol))


def judge_residual(learner, bugs, kata, p, q, case):
    tol, loose = tolerances(kata)
    got = learner.residual(p, q)
    expect.array(got, bugs.reference.residual(p, q), call="residual(p, q)", case=case, **tol, float32_inside=loose,
                 what="the residual distribution", axes=("token",),
                 diagnose=lambda: bugs.match(got, lambda impl: impl.residual(p, q), **tol))


def test_residual(learner, bugs, kata, rng):
    """the residual is max(p - q, 0) normalised, and p where p == q"""
    for p_zeros, q_zeros in DISTRIBUTIONS:
        p, q = distribution(rng, p_zeros), distribution(rng, q_zeros)
        judge_residual(learner, bugs, kata, p, q, pq_text(p_zeros, q_zeros))
    p = distribution(rng, ())
    judge_residual(learner, bugs, kata, p, p.clone(), "p == q: float64 (6,), one random distribution twice; "
                   "nothing is ever rejected, no excess is left")


def step_distribution(impl, p, q, judge=lambda call, value: None):
    """The law of the token one speculative step emits, computed, not sampled: the draft proposes
    x with q[x] and it is kept with accept(x); else (probability 1 - sum of q·accept) the token is
    drawn from the residual. (V,) float64. ``judge(call, value)`` sees each answer first."""
    kept = torch.zeros_like(q)   # (V,)
    for token in range(q.shape[0]):
        if q[token] > 0:   # the draft never proposes a token of q 0
            rate = impl.accept_probability(p, q, token)
            judge(f"accept_probability(p, q, {token})", rate)
            kept[token] = q[token] * rate
    left = impl.residual(p, q)
    judge("residual(p, q)", left)
    return kept + (1 - kept.sum()) * left


def test_step_gives_target(learner, bugs, kata, rng):
    """one speculative step emits each token with exactly the target's probability p"""
    tol, loose = tolerances(kata)
    for p_zeros, q_zeros in DISTRIBUTIONS:
        p, q = distribution(rng, p_zeros), distribution(rng, q_zeros)
        case = (pq_text(p_zeros, q_zeros) + "; P(x) = q[x]·accept_probability(p, q, x) + "
                "(1 - Σ q·accept_probability)·residual(p, q)[x]")

        def judge(call, value):
            if call.startswith("accept"):
                expect.type_of(value, float, call=call, case=case)
            else:
                expect.form(value, torch.Tensor, (TOKENS,), dtype=torch.float64, call=call, case=case)

        got = step_distribution(learner, p, q, judge)
        expect.values(got, p, call="one speculative step: accept_probability, then residual on a rejection",
                      case=case, what="the law of the emitted token", against="the target's distribution p",
                      **tol, float32_inside=loose,
                      diagnose=lambda: bugs.match(got, lambda impl: step_distribution(impl, p, q), **tol))


# --- the cache after verification -------------------------------------------------------------------

# (tree, prefix_len, accepted path): a branch deep in the bushy tree, whose nodes' indices are not
# their depths; the other root's branch; a chain's first two nodes (a truncation keeps them too);
# nothing accepted (the prefix alone stays).
ROLLBACKS = ((BUSHY, 3, [0, 2, 6]), (BUSHY, 3, [1, 4, 7]), ([-1, 0, 1, 2], 2, [0, 1]), (BUSHY, 3, []))


def rotate(x, positions):
    """RoPE (rotate-half layout) at ``positions`` (T,): x (B, H, T, hd), so that a key's value
    depends on where it stands."""
    half = x.shape[-1] // 2
    freq = ROPE_BASE ** (-torch.arange(half, dtype=torch.float64) / half)   # (hd/2,)
    angle = positions.double()[:, None] * freq   # (T, hd/2)
    cos, sin = angle.cos().repeat(1, 2), angle.sin().repeat(1, 2)   # (T, hd)
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def tree_cache(k_raw, v_raw, prefix_len, node_positions):
    """The cache one target pass leaves: keys rotated to the prefix's positions, then the nodes'."""
    positions = torch.cat([torch.arange(prefix_len), node_positions])   # (P + N,)
    return rotate(k_raw, positions), v_raw.clone()


def decode(cache, q_new, k_new, v_new):
    """The next token's attention over the cache and itself: (B, H, 1, hd)."""
    k, v = cache
    at = torch.tensor([k.shape[2]])   # the next token's position: one past the cache
    q, k_new = rotate(q_new, at), rotate(k_new, at)
    keys, values = torch.cat([k, k_new], dim=2), torch.cat([v, v_new], dim=2)
    weights = torch.softmax(q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ values


def after_verification(impl, k_raw, v_raw, parents, prefix_len, path):
    """The cache ``impl`` leaves after a target pass at its tree_positions and its rollback."""
    cache = tree_cache(k_raw, v_raw, prefix_len, impl.tree_positions(parents, prefix_len))
    return impl.rollback(cache, prefix_len, path)


def test_rollback_then_decode(learner, bugs, kata, rng):
    """after rollback, decoding the next token equals a fresh decode of the prefix and the accepted tokens"""
    tol, loose = tolerances(kata)
    for parents, prefix_len, path in ROLLBACKS:
        n, kept = len(parents), prefix_len + len(path)
        k_raw, v_raw = normal(rng, B, H, prefix_len + n, HD), normal(rng, B, H, prefix_len + n, HD)
        q_new, k_new, v_new = (normal(rng, B, H, 1, HD) for _ in range(3))
        case = (f"{tree_text(parents, prefix_len)}, path = {path}; cache: (k, v), float64 ({B}, {H}, "
                f"{prefix_len + n}, {HD}) each, keys rotated (RoPE) at the positions tree_positions gave")
        call = f"rollback(cache, {prefix_len}, {path})"
        positions = learner.tree_positions(parents, prefix_len)
        expect.form(positions, torch.Tensor, (n,), dtype=torch.int64, call=f"tree_positions({parents}, {prefix_len})",
                    case=case)
        got = learner.rollback(tree_cache(k_raw, v_raw, prefix_len, positions), prefix_len, path)
        expected = after_verification(bugs.reference, k_raw, v_raw, parents, prefix_len, path)
        diagnose = lambda: bugs.match(got, lambda impl: after_verification(impl, k_raw, v_raw, parents, prefix_len,
                                                                           path), **tol)
        expect.type_of(got, tuple, call=call, case=case)
        expect.that(len(got) == 2, "rollback must return a pair (k, v).", call=call, case=case,
                    got=f"a tuple of {len(got)}", expected="(k, v)")
        for x, what in zip(got, ("the keys", "the values")):
            expect.type_of(x, torch.Tensor, call=call, case=case, what=what)
            expect.that(tuple(x.shape) == (B, H, kept, HD) and x.dtype == torch.float64,
                        f"{what.capitalize()} must keep the prefix and the {len(path)} accepted nodes, float64.",
                        call=call, case=case, got=expect.describe_value(x),
                        expected=f"tensor float64{[B, H, kept, HD]}", diagnose=diagnose)
        expect.array(decode(got, q_new, k_new, v_new), decode(expected, q_new, k_new, v_new),
                     call=f"{call}, then one decoding step", case=case, **tol, float32_inside=loose,
                     what="the next token's attention output",
                     against="a fresh decode of the prefix and the accepted tokens",
                     axes=("batch", "head", "position", "channel"), diagnose=diagnose)
