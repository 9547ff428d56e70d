"""vLLM's rejection sampler (vllm/v1/sample/rejection_sampler.py) in plain torch: target_probs and
draft_probs, accept where uniform < target / draft, recovered tokens from max(target - draft, 0);
the tree handled with tensors of parents and depths."""
import torch


def tree_mask(parents, prefix_len):
    parent = torch.tensor(parents, dtype=torch.long)
    n = parent.numel()
    # ancestor[i, j]: j is i or above it. Close the one-step relation n times.
    step = torch.zeros(n, n, dtype=torch.bool)
    has_parent = parent >= 0
    step[torch.arange(n)[has_parent], parent[has_parent]] = True
    ancestor = torch.eye(n, dtype=torch.bool)
    for _ in range(n):
        ancestor = ancestor | ((ancestor.float() @ step.float()) > 0)
    return torch.cat([torch.ones(n, prefix_len, dtype=torch.bool), ancestor], dim=1)


def tree_positions(parents, prefix_len):
    depth = torch.zeros(len(parents), dtype=torch.long)
    for i, p in enumerate(parents):
        if p >= 0:
            depth[i] = depth[p] + 1
    return depth + prefix_len


def accept_greedy(tokens, parents, target_logits):
    target_argmax = target_logits.argmax(dim=-1)
    draft_token_ids = torch.tensor(tokens, dtype=torch.long)
    parent = torch.tensor(parents, dtype=torch.long)
    accepted, last = [], -1
    while True:
        row = last + 1
        match = (parent == last) & (draft_token_ids == target_argmax[row])
        if not bool(match.any()):
            break
        last = int(match.nonzero()[0, 0])
        accepted.append(last)
    bonus_token_id = int(target_argmax[last + 1])
    return accepted, bonus_token_id


def accept_probability(p, q, token):
    target_prob = p[token]
    draft_prob = q[token]
    return float(torch.minimum(draft_prob / target_prob, torch.ones_like(target_prob)))


def residual(p, q):
    recovered_probs = (p - q).clamp_min(0.0)
    total = recovered_probs.sum()
    if total <= 0:
        return p.clone()
    return recovered_probs / total


def rollback(cache, prefix_len, path):
    k, v = cache
    keep = torch.arange(prefix_len + len(path))
    keep[prefix_len:] = prefix_len + torch.tensor(path, dtype=torch.long)
    return k[:, :, keep].contiguous(), v[:, :, keep].contiguous()
