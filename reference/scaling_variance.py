import numpy as np


def _divisor(d_k: int, scale: str) -> float:
    """The s that scores are divided by; an unknown name is an error, never a silent default."""
    divisors = {"none": 1.0, "sqrt": np.sqrt(d_k), "linear": float(d_k)}
    if scale not in divisors:
        raise ValueError(f"unknown scale {scale!r}: use 'none', 'sqrt' or 'linear'")
    return divisors[scale]


def score_std(d_k: int, scale: str = "sqrt") -> float:
    """Analytic standard deviation of the score ``q·k / s`` for q, k with i.i.d. N(0, 1) entries.

    ``scale`` picks s: ``"none"`` (1), ``"sqrt"`` (sqrt(d_k)) or ``"linear"`` (d_k); any other
    value raises ValueError. Returns a float.
    """
    # q·k sums d_k independent products q_i k_i, each with mean 0 and variance 1 · 1: Var = d_k.
    return float(np.sqrt(d_k) / _divisor(d_k, scale))


def sample_score_std(d_k: int, scale: str = "sqrt", n_samples: int = 10_000, seed: int = 0) -> float:
    """Sample standard deviation of ``q·k / s`` over ``n_samples`` random pairs (q, k).

    Draws with ``np.random.default_rng(seed)``, so a seed gives the same float every time. Lands
    within a few percent of ``score_std(d_k, scale)``. An unknown ``scale`` raises ValueError.
    """
    s = _divisor(d_k, scale)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_samples, d_k))   # (N, d_k)
    k = rng.standard_normal((n_samples, d_k))   # (N, d_k)
    scores = np.sum(q * k, axis=-1) / s         # (N,)
    return float(np.std(scores))


def _max_weights(d_k: int, n_keys: int, scale: str, n_trials: int, seed: int) -> np.ndarray:
    """The largest softmax weight of each trial: one random query against ``n_keys`` random keys."""
    s = _divisor(d_k, scale)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_trials, d_k, 1))        # (N, d_k, 1)
    k = rng.standard_normal((n_trials, n_keys, d_k))   # (N, n_keys, d_k)
    scores = (k @ q)[..., 0] / s                       # (N, n_keys)
    # Subtract each row's max: unscaled scores at d_k = 512 spread over about ±70.
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))   # (N, n_keys)
    return (e / e.sum(axis=-1, keepdims=True)).max(axis=-1)   # (N,)


def mean_max_weight(d_k: int, n_keys: int = 16, scale: str = "sqrt",
                    n_trials: int = 2_000, seed: int = 0) -> float:
    """Mean, over ``n_trials`` trials, of the largest softmax weight of one random query against
    ``n_keys`` random keys (scores ``q·k / s``, entries i.i.d. N(0, 1)).

    Near 1 the softmax is saturated: one key takes all the weight and the gradients vanish. Near
    ``1 / n_keys`` it is uniform: attention ignores the scores. Draws with
    ``np.random.default_rng(seed)``. An unknown ``scale`` raises ValueError.
    """
    return float(np.mean(_max_weights(d_k, n_keys, scale, n_trials, seed)))
