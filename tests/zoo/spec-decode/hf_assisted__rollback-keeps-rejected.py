"""Hugging Face assisted generation (a chain of candidate tokens checked by the target in one
forward): `selected_tokens = new_logits.argmax(-1)`, `n_matches` from a cumulative sum of
mismatches, the bonus token `selected_tokens[n_matches]`, then the cache cut to the accepted
tokens. A tree is its branches: each is checked as a chain, and the cache gathered, not cropped."""
import torch


def _branch(parents, node):
    branch = []
    while node != -1:
        branch.append(node)
        node = parents[node]
    return branch[::-1]


def tree_mask(parents, prefix_len):
    n = len(parents)
    attention_mask = torch.zeros(n, prefix_len + n, dtype=torch.bool)
    attention_mask[:, :prefix_len] = True
    for i in range(n):
        attention_mask[i, [prefix_len + j for j in _branch(parents, i)]] = True
    return attention_mask


def tree_positions(parents, prefix_len):
    cache_position = [prefix_len + len(_branch(parents, i)) - 1 for i in range(len(parents))]
    return torch.tensor(cache_position, dtype=torch.long)


def accept_greedy(tokens, parents, target_logits):
    selected_tokens = target_logits.argmax(dim=-1)   # (N + 1,)
    accepted = []
    while True:
        last = accepted[-1] if accepted else -1
        children = [i for i in range(len(parents)) if parents[i] == last]
        candidate_new_tokens = torch.tensor([tokens[i] for i in children], dtype=torch.long)
        n_matches = (candidate_new_tokens == selected_tokens[last + 1]).nonzero()
        if n_matches.numel() == 0:
            break
        accepted.append(children[int(n_matches[0, 0])])
    last = accepted[-1] if accepted else -1
    return accepted, selected_tokens[last + 1].item()


def accept_probability(p, q, token):
    probability_ratio = p[token] / q[token]
    return min(probability_ratio.item(), 1.0)


def residual(p, q):
    p_prime = torch.clamp(p - q, min=0)
    if p_prime.sum() == 0:
        return p.clone()
    return p_prime.div(p_prime.sum())


def rollback(cache, prefix_len, path):
    key_cache, value_cache = cache
    # DynamicCache.crop(max_length): right for assisted generation's chain, not for a tree.
    max_length = prefix_len + len(path)
    return key_cache[..., :max_length, :], value_cache[..., :max_length, :]
