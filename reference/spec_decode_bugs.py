"""Known spec-decode bugs, each a complete reference with exactly that mistake."""
import torch


def mask_causal_over_nodes(parents, prefix_len):
    n = len(parents)
    # The chain's causal mask used for a tree: node i sees every node before it, its siblings and
    # their subtrees included, as if the tree were one sequence.
    return torch.ones(n, prefix_len + n, dtype=torch.bool).tril(prefix_len)


def mask_with_siblings(parents, prefix_len):
    n = len(parents)
    mask = torch.zeros(n, prefix_len + n, dtype=torch.bool)
    mask[:, :prefix_len] = True
    for i, parent in enumerate(parents):
        if parent >= 0:
            mask[i] = mask[parent]
        # The whole family is marked, not the node alone: each node sees its brothers and sisters.
        for j, other in enumerate(parents):
            if other == parent:
                mask[i, prefix_len + j] = True
    return mask


def positions_by_index(parents, prefix_len):
    # Node i placed at prefix_len + i, as if the tree were one sequence: right for a chain only.
    return prefix_len + torch.arange(len(parents), dtype=torch.int64)


def positions_by_index_loop(parents, prefix_len):
    positions = []
    for i in range(len(parents)):
        positions.append(prefix_len + i)   # counts the nodes written so far, not the node's ancestors
    return torch.tensor(positions, dtype=torch.int64)


def positions_from_one(parents, prefix_len):
    depth = []
    for parent in parents:
        depth.append(1 if parent < 0 else depth[parent] + 1)   # a root at depth 1: one too far
    return prefix_len + torch.tensor(depth, dtype=torch.int64)


def positions_from_last_prefix_token(parents, prefix_len):
    depth = []
    for parent in parents:
        depth.append(0 if parent < 0 else depth[parent] + 1)
    # prefix_len - 1 is the last prefix token's position, not its child's.
    return prefix_len - 1 + torch.tensor(depth, dtype=torch.int64)


def accept_greedy_no_bonus_at_leaf(tokens, parents, target_logits):
    best = target_logits.argmax(dim=-1)
    path, row = [], 0
    while True:
        last = path[-1] if path else -1
        children = [i for i, p in enumerate(parents) if p == last]
        child = next((i for i in children if tokens[i] == best[row]), None)
        if child is None:
            # Only a rejection is thought to give a token: at a leaf nothing was rejected.
            return path, (int(best[row]) if children else None)
        path.append(child)
        row = child + 1


def accept_greedy_no_bonus_sentinel(tokens, parents, target_logits):
    best = target_logits.argmax(dim=-1)
    path, row = [], 0
    while True:
        last = path[-1] if path else -1
        children = [i for i, p in enumerate(parents) if p == last]
        if not children:
            return path, -1   # -1 for "no correction needed": every drafted token of the branch was accepted
        child = next((i for i in children if tokens[i] == best[row]), None)
        if child is None:
            return path, int(best[row])   # the target's correction of the rejected token
        path.append(child)
        row = child + 1


def accept_probability_inverted(p, q, token):
    return min(1.0, float(q[token] / p[token]))   # the draft's over the target's


def accept_probability_inverted_division(p, q, token):
    ratio = q[token] / p[token]
    return float(torch.clamp(ratio, max=1.0))


def residual_unnormalised(p, q):
    return (p - q).clamp(min=0)   # the excess, but it sums to the rejection probability, not 1


def residual_unnormalised_relu(p, q):
    excess = torch.relu(p - q)
    if excess.sum() == 0:
        return p.clone()
    return excess / p.sum()   # normalised by p's total, 1, not by the excess's


def rollback_truncate(cache, prefix_len, path):
    k, v = cache
    # Right for a chain, where the accepted nodes are the first ones: in a tree they are not.
    keep = prefix_len + len(path)
    return k[:, :, :keep], v[:, :, :keep]


def rollback_keep_all(cache, prefix_len, path):
    k, v = cache
    # Nothing rolled back: the rejected nodes' keys stay for the next step to attend to.
    return k, v


BUGS = {
    "siblings-see-each-other": [{"tree_mask": mask_causal_over_nodes}, {"tree_mask": mask_with_siblings}],
    "positions-not-by-depth": [{"tree_positions": positions_by_index}, {"tree_positions": positions_by_index_loop}],
    "position-off-by-one": [{"tree_positions": positions_from_one},
                            {"tree_positions": positions_from_last_prefix_token}],
    "bonus-token-missing": [{"accept_greedy": accept_greedy_no_bonus_at_leaf},
                            {"accept_greedy": accept_greedy_no_bonus_sentinel}],
    "ratio-inverted": [{"accept_probability": accept_probability_inverted},
                       {"accept_probability": accept_probability_inverted_division}],
    "residual-not-normalised": [{"residual": residual_unnormalised}, {"residual": residual_unnormalised_relu}],
    "rollback-keeps-rejected": [{"rollback": rollback_truncate}, {"rollback": rollback_keep_all}],
}
