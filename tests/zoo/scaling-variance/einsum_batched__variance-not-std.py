"""einsum-heavy, with np.var where np.std is due (and d_k / s**2 analytically): the variance of
the scores, not their spread."""
import numpy as np

DIVISOR = {"none": lambda d: 1.0, "sqrt": np.sqrt, "linear": float}


def _divisor(d_k, scale):
    if scale not in DIVISOR:
        raise ValueError(f"unknown scale {scale!r}")
    return DIVISOR[scale](d_k)


def score_std(d_k, scale="sqrt"):
    return float(d_k / _divisor(d_k, scale) ** 2)


def sample_score_std(d_k, scale="sqrt", n_samples=10_000, seed=0):
    s = _divisor(d_k, scale)
    qk = np.random.default_rng(seed).standard_normal((n_samples, 2, d_k))
    return float(np.var(np.einsum("nd,nd->n", qk[:, 0], qk[:, 1]) / s))


def mean_max_weight(d_k, n_keys=16, scale="sqrt", n_trials=2_000, seed=0):
    s = _divisor(d_k, scale)
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((n_trials, n_keys, d_k))
    q = rng.standard_normal((n_trials, d_k))
    scores = np.einsum("nkd,nd->nk", k, q) / s
    w = np.exp(scores - scores.max(axis=1, keepdims=True))
    return float((w / w.sum(axis=1, keepdims=True)).max(axis=1).mean())
