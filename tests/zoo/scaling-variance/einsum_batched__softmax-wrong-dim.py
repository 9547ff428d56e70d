"""einsum-heavy and batched, with the softmax taken over axis 0 of the "nk" scores: over the trials,
each trial's one query, instead of over its keys. Each key's weights then sum to 1 across the
queries, a query's largest weight shrinks as n_trials grows, and the mean max weight is near 0 for
every scale (softmax-wrong-dim)."""
import numpy as np


def _divisor(d_k, scale):
    match scale:
        case "none":
            return 1.0
        case "sqrt":
            return np.sqrt(d_k)
        case "linear":
            return float(d_k)
    raise ValueError(f"scale must be 'none', 'sqrt' or 'linear', not {scale!r}")


def score_std(d_k, scale="sqrt"):
    return np.sqrt(d_k) / _divisor(d_k, scale)


def sample_score_std(d_k, scale="sqrt", n_samples=10_000, seed=0):
    s = _divisor(d_k, scale)
    qk = np.random.default_rng(seed).standard_normal((n_samples, 2, d_k))
    return np.einsum("nd,nd->n", qk[:, 0], qk[:, 1]).std(ddof=1) / s


def mean_max_weight(d_k, n_keys=16, scale="sqrt", n_trials=2_000, seed=0):
    s = _divisor(d_k, scale)
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((n_trials, n_keys, d_k))
    q = rng.standard_normal((n_trials, d_k))
    scores = np.einsum("nkd,nd->nk", k, q) / s
    w = np.exp(scores - scores.max(axis=0, keepdims=True))
    return (w / w.sum(axis=0, keepdims=True)).max(axis=1).mean()
