"""Reference of the spec-decode kata: verify a tree of drafted tokens in one pass of the target model.

A draft model (or Medusa's heads, or EAGLE's draft layer) proposes a tree of tokens after the
prefix; the target model reads every node in one forward pass, with a mask that lets each node see
only the prefix and its own branch, and positions by depth. Greedy verification walks the tree
along the target's argmax (Medusa, EAGLE); sampled verification accepts a draft token x with
probability min(1, p(x) / q(x)) and on rejection samples max(p - q, 0), normalised (Leviathan et
al. 2023, "Fast Inference from Transformers via Speculative Decoding", and Chen et al. 2023): the
tokens that come out are distributed exactly as the target's. The KV cache then keeps the prefix
and the accepted branch only.
"""
import torch


def tree_mask(parents: list[int], prefix_len: int) -> torch.Tensor:
    """The attention mask of one target pass over a draft tree: bool (N, prefix_len + N), True =
    may attend. Row i is node i; columns are the prefix's tokens, then the N nodes. Node i sees the
    whole prefix, its ancestors and itself. ``parents[i]`` is the index of node i's parent among
    the nodes, -1 for a child of the prefix's last token; parents come before their children."""
    n = len(parents)
    mask = torch.zeros(n, prefix_len + n, dtype=torch.bool)   # (N, P + N)
    mask[:, :prefix_len] = True   # every node continues the whole prefix
    for i, parent in enumerate(parents):
        if parent >= 0:
            mask[i] = mask[parent]   # (P + N,) the parent's row is complete: its ancestors, itself
        mask[i, prefix_len + i] = True   # and the node itself: never its siblings nor their subtrees
    return mask


def tree_positions(parents: list[int], prefix_len: int) -> torch.Tensor:
    """The position of each node in the target pass: int64 (N,), prefix_len + its depth (a child
    of the prefix is at depth 0). Every node of one depth stands where its branch would put it."""
    depth = []
    for parent in parents:   # parents come first: their depth is known
        depth.append(0 if parent < 0 else depth[parent] + 1)
    return prefix_len + torch.tensor(depth, dtype=torch.int64)   # (N,)


def accept_greedy(tokens: list[int], parents: list[int], target_logits: torch.Tensor) -> tuple[list[int], int]:
    """Greedy verification of a draft tree. ``tokens[i]`` is node i's token; ``target_logits``
    (N + 1, V) are the target's logits after the prefix (row 0) and after node i (row i + 1). From
    the prefix, accept the child whose token is the target's argmax (the first such child), until
    no child is. Returns (path, bonus_token): the accepted nodes' indices, root first, and the
    target's argmax after the last of them (after the prefix when none is accepted), as Python ints."""
    best = target_logits.argmax(dim=-1)   # (N + 1,) the target's token after the prefix, after each node
    path, row = [], 0   # row: the logits after the last accepted token
    while True:
        last = path[-1] if path else -1
        child = next((i for i, p in enumerate(parents) if p == last and tokens[i] == best[row]), None)
        if child is None:
            break
        path.append(child)
        row = child + 1
    # The target's choice after the last accepted token is one more token for free: a step that
    # accepts k drafted tokens emits k + 1.
    return path, int(best[row])


def accept_probability(p: torch.Tensor, q: torch.Tensor, token: int) -> float:
    """The probability of accepting a token x the draft sampled: min(1, p[x] / q[x]), p the
    target's distribution (V,), q the draft's (V,), q[x] > 0 since the draft drew x. A Python float."""
    # Where the draft proposes x less often than the target would emit it, x is always kept; where
    # it proposes x too often, only the share p / q of its proposals are.
    return min(1.0, float(p[token] / q[token]))


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The distribution sampled after a rejection: max(p - q, 0), normalised to sum to 1, (V,).
    Where p == q nothing is ever rejected and no mass is left: it returns p."""
    excess = (p - q).clamp(min=0)   # (V,) where the target wants more than the draft proposes
    mass = excess.sum()   # the probability of a rejection: sum of max(p - q, 0) = 1 - sum of min(p, q)
    if mass == 0:
        return p.clone()   # (V,) never sampled (every token is accepted): any distribution is right, p is natural
    return excess / mass   # (V,)


def rollback(cache: tuple[torch.Tensor, torch.Tensor], prefix_len: int,
             path: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache after verification: ``cache`` is (k, v), each (B, H, prefix_len + N, head_dim),
    the target pass's keys and values of the prefix then the N nodes; ``path`` the accepted nodes.
    Returns (k, v), each (B, H, prefix_len + len(path), head_dim): the prefix, then the accepted
    nodes in path order, as if the target had read the prefix and the accepted tokens alone."""
    k, v = cache
    # The accepted nodes are scattered in the tree's order: gather them, a truncation keeps the
    # first nodes whichever branch they are on.
    keep = torch.cat([torch.arange(prefix_len), prefix_len + torch.tensor(path, dtype=torch.int64)])   # (P + A,)
    return k[:, :, keep], v[:, :, keep]   # (B, H, P + A, hd) each
