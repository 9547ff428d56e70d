"""Plain Python loops over the nodes: the tree as a parents list, nothing vectorised."""
import torch


def tree_mask(parents, prefix_len):
    n = len(parents)
    mask = torch.zeros(n, prefix_len + n, dtype=torch.bool)
    for i in range(n):
        for j in range(prefix_len):
            mask[i, j] = True
        node = i
        while node != -1:   # climb to the root, marking the node and each ancestor
            mask[i, prefix_len + node] = True
            node = parents[node]
    return mask


def tree_positions(parents, prefix_len):
    positions = []
    for i in range(len(parents)):
        depth, node = 0, parents[i]
        while node != -1:
            depth += 1
            node = parents[node]
        positions.append(prefix_len + depth)
    return torch.tensor(positions, dtype=torch.int64)


def accept_greedy(tokens, parents, target_logits):
    path = []
    current = -1
    while True:
        row = 0 if current == -1 else current + 1
        want = int(torch.argmax(target_logits[row]))
        nxt = -1
        for i in range(len(parents)):
            if parents[i] == current and tokens[i] == want:
                nxt = i
                break
        if nxt == -1:
            return path, want
        path.append(nxt)
        current = nxt


def accept_probability(p, q, token):
    ratio = p[token].item() / q[token].item()
    return ratio if ratio < 1.0 else 1.0


def residual(p, q):
    out = torch.zeros_like(p)
    total = 0.0
    for x in range(p.shape[0]):
        diff = p[x].item() - q[x].item()
        if diff > 0:
            out[x] = diff
            total += diff
    if total == 0.0:
        return p.clone()
    return out / total


def rollback(cache, prefix_len, path):
    k, v = cache
    rows = list(range(prefix_len)) + [prefix_len + i for i in path]
    new_k = torch.stack([k[:, :, r] for r in rows], dim=2)
    new_v = torch.stack([v[:, :, r] for r in rows], dim=2)
    return new_k, new_v
