"""Medusa's buffers (generate_medusa_buffers): each node named by its path from the root, an
attention mask that starts from the identity and copies in each ancestor's column, position ids by
depth, and retrieve indices that gather the accepted branch."""
import torch


def _node_paths(parents):
    """Each node as the tuple of node indices from its root down to it (Medusa's choices)."""
    paths = []
    for i, parent in enumerate(parents):
        paths.append((i,) if parent == -1 else paths[parent] + (i,))
    return paths


def tree_mask(parents, prefix_len):
    medusa_len = len(parents)
    medusa_attn_mask = torch.eye(medusa_len, medusa_len)
    for i, path in enumerate(_node_paths(parents)):
        for ancestor in path[:-1]:
            medusa_attn_mask[i, ancestor] = 1
    prefix = torch.ones(medusa_len, prefix_len)
    return torch.cat([prefix, medusa_attn_mask], dim=1).bool()


def tree_positions(parents, prefix_len):
    medusa_position_ids = torch.zeros(len(parents), dtype=torch.long)
    for i, path in enumerate(_node_paths(parents)):
        medusa_position_ids[i] = len(path) - 1
    return medusa_position_ids + prefix_len


def accept_greedy(tokens, parents, target_logits):
    # retrieve_indices: one row per leaf, its branch's nodes; the logits gathered along each branch.
    paths = _node_paths(parents)
    leaves = [i for i in range(len(parents)) if i not in parents]
    posterior = target_logits.argmax(dim=-1)
    accept_path = []
    for depth in range(max((len(paths[leaf]) for leaf in leaves), default=0)):
        row = accept_path[-1] + 1 if accept_path else 0
        candidates = [path[depth] for path in (paths[leaf] for leaf in leaves)
                      if len(path) > depth and list(path[:depth]) == accept_path]
        hit = [node for node in sorted(set(candidates)) if tokens[node] == posterior[row]]
        if not hit:
            break
        accept_path.append(hit[0])
    row = accept_path[-1] + 1 if accept_path else 0
    return accept_path, posterior[row].item()


def accept_probability(p, q, token):
    return torch.clamp(p[token] / q[token], max=1.0).item()


def residual(p, q):
    diff = torch.maximum(p - q, torch.zeros_like(p))
    norm = diff.sum()
    return p.clone() if norm == 0 else diff / norm


def rollback(cache, prefix_len, path):
    select_indices = torch.tensor(list(range(prefix_len)) + [prefix_len + i for i in path], dtype=torch.long)
    k, v = cache
    return k.index_select(2, select_indices), v.index_select(2, select_indices)
