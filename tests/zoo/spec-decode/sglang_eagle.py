"""SGLang's EAGLE tree (build_tree_kernel's ideas in torch): a first-child / next-sibling linked
list (retrive_next_token, retrive_next_sibling), positions seq_len + depth, and greedy
verification that follows the list (verify_tree_greedy)."""
import torch


def _links(parents):
    n = len(parents)
    retrive_next_token = [-1] * (n + 1)     # slot 0: the prefix's last token; slot i + 1: node i
    retrive_next_sibling = [-1] * (n + 1)
    last_child = [-1] * (n + 1)
    for i, parent in enumerate(parents):
        slot = parent + 1
        if retrive_next_token[slot] == -1:
            retrive_next_token[slot] = i + 1
        else:
            retrive_next_sibling[last_child[slot]] = i + 1
        last_child[slot] = i + 1
    return retrive_next_token, retrive_next_sibling


def tree_mask(parents, prefix_len):
    n = len(parents)
    tree = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        tree[i, i] = True
        if parents[i] != -1:
            tree[i] |= tree[parents[i]]
    seq = torch.ones(n, prefix_len, dtype=torch.bool)
    return torch.cat((seq, tree), dim=-1)


def tree_positions(parents, prefix_len):
    retrive_next_token, retrive_next_sibling = _links(parents)
    positions = torch.empty(len(parents), dtype=torch.int64)
    level, depth = [0], 0   # slot 0: the prefix's last token
    while level:   # breadth first: the children of every slot of this level are one deeper
        below = []
        for slot in level:
            child = retrive_next_token[slot]
            while child != -1:
                positions[child - 1] = prefix_len + depth
                below.append(child)
                child = retrive_next_sibling[child]
        level, depth = below, depth + 1
    return positions


def verify_tree_greedy(candidates, retrive_next_token, retrive_next_sibling, target_predict):
    accept_index, cur = [], 0
    while True:
        child = retrive_next_token[cur]
        while child != -1 and candidates[child] != target_predict[cur]:
            child = retrive_next_sibling[child]
        if child == -1:
            return accept_index, target_predict[cur]
        accept_index.append(child - 1)
        cur = child


def accept_greedy(tokens, parents, target_logits):
    retrive_next_token, retrive_next_sibling = _links(parents)
    candidates = [-1] + list(tokens)
    target_predict = target_logits.argmax(dim=-1).tolist()
    return verify_tree_greedy(candidates, retrive_next_token, retrive_next_sibling, target_predict)


def accept_probability(p, q, token):
    prob_acc = p[token] / q[token]
    return 1.0 if prob_acc >= 1 else prob_acc.item()


def residual(p, q):
    relu_diff = torch.relu(p - q)
    sum_relu = relu_diff.sum()
    if sum_relu == 0:
        return p.clone()
    return relu_diff / sum_relu


def rollback(cache, prefix_len, path):
    k, v = cache
    accept_index = torch.tensor(path, dtype=torch.int64) + prefix_len
    return (torch.cat([k[:, :, :prefix_len], k[:, :, accept_index]], dim=2),
            torch.cat([v[:, :, :prefix_len], v[:, :, accept_index]], dim=2))
