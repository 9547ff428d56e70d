import torch


def tree_mask(parents: list[int], prefix_len: int) -> torch.Tensor:
    """The attention mask of one target pass over a draft tree: bool (N, prefix_len + N), True =
    may attend. Row i is node i; columns are the prefix's tokens, then the N nodes. Node i sees the
    whole prefix, its ancestors and itself. ``parents[i]`` is the index of node i's parent among
    the nodes, -1 for a child of the prefix's last token; parents come before their children."""
    raise NotImplementedError("write tree_mask")


def tree_positions(parents: list[int], prefix_len: int) -> torch.Tensor:
    """The position of each node in the target pass: int64 (N,), prefix_len + its depth (a child
    of the prefix is at depth 0). Every node of one depth stands where its branch would put it."""
    raise NotImplementedError("write tree_positions")


def accept_greedy(tokens: list[int], parents: list[int], target_logits: torch.Tensor) -> tuple[list[int], int]:
    """Greedy verification of a draft tree. ``tokens[i]`` is node i's token; ``target_logits``
    (N + 1, V) are the target's logits after the prefix (row 0) and after node i (row i + 1). From
    the prefix, accept the child whose token is the target's argmax (the first such child), until
    no child is. Returns (path, bonus_token): the accepted nodes' indices, root first, and the
    target's argmax after the last of them (after the prefix when none is accepted), as Python ints."""
    raise NotImplementedError("write accept_greedy")


def accept_probability(p: torch.Tensor, q: torch.Tensor, token: int) -> float:
    """The probability of accepting a token x the draft sampled: min(1, p[x] / q[x]), p the
    target's distribution (V,), q the draft's (V,), q[x] > 0 since the draft drew x. A Python float."""
    raise NotImplementedError("write accept_probability")


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The distribution sampled after a rejection: max(p - q, 0), normalised to sum to 1, (V,).
    Where p == q nothing is ever rejected and no mass is left: it returns p."""
    raise NotImplementedError("write residual")


def rollback(cache: tuple[torch.Tensor, torch.Tensor], prefix_len: int,
             path: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache after verification: ``cache`` is (k, v), each (B, H, prefix_len + N, head_dim),
    the target pass's keys and values of the prefix then the N nodes; ``path`` the accepted nodes.
    Returns (k, v), each (B, H, prefix_len + len(path), head_dim): the prefix, then the accepted
    nodes in path order, as if the target had read the prefix and the accepted tokens alone."""
    raise NotImplementedError("write rollback")
