import numpy as np


def score_std(d_k: int, scale: str = "sqrt") -> float:
    """Analytic standard deviation of the score ``q·k / s`` for q, k with i.i.d. N(0, 1) entries.

    ``scale`` picks s: ``"none"`` (1), ``"sqrt"`` (sqrt(d_k)) or ``"linear"`` (d_k); any other
    value raises ValueError. Returns a float.
    """
    raise NotImplementedError("write score_std")


def sample_score_std(d_k: int, scale: str = "sqrt", n_samples: int = 10_000, seed: int = 0) -> float:
    """Sample standard deviation of ``q·k / s`` over ``n_samples`` random pairs (q, k).

    Draws with ``np.random.default_rng(seed)``, so a seed gives the same float every time. Lands
    within a few percent of ``score_std(d_k, scale)``. An unknown ``scale`` raises ValueError.
    """
    raise NotImplementedError("write sample_score_std")


def mean_max_weight(d_k: int, n_keys: int = 16, scale: str = "sqrt",
                    n_trials: int = 2_000, seed: int = 0) -> float:
    """Mean, over ``n_trials`` trials, of the largest softmax weight of one random query against
    ``n_keys`` random keys (scores ``q·k / s``, entries i.i.d. N(0, 1)).

    Near 1 the softmax is saturated: one key takes all the weight and the gradients vanish. Near
    ``1 / n_keys`` it is uniform: attention ignores the scores. Draws with
    ``np.random.default_rng(seed)``. An unknown ``scale`` raises ValueError.
    """
    raise NotImplementedError("write mean_max_weight")
