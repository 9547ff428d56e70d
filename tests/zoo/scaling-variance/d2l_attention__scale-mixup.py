"""d2l-style, with the scale names' meanings swapped: "sqrt" divides by d and "linear" by d ** 0.5."""
import numpy as np

SCALES = ("none", "sqrt", "linear")


def _scale(d, scale):
    if scale not in SCALES:
        raise ValueError(f"scale is one of {SCALES}, got {scale!r}")
    return {"none": 1, "sqrt": d, "linear": d ** 0.5}[scale]


def score_std(d_k, scale="sqrt"):
    return float(d_k ** 0.5 / _scale(d_k, scale))


def sample_score_std(d_k, scale="sqrt", n_samples=10_000, seed=0):
    rng = np.random.default_rng(seed)
    queries = rng.standard_normal((n_samples, 1, d_k))
    keys = rng.standard_normal((n_samples, 1, d_k))
    return float((np.matmul(queries, keys.swapaxes(1, 2)) / _scale(d_k, scale)).std())


def mean_max_weight(d_k, n_keys=16, scale="sqrt", n_trials=2_000, seed=0):
    rng = np.random.default_rng(seed)
    queries = rng.standard_normal((n_trials, 1, d_k))
    keys = rng.standard_normal((n_trials, n_keys, d_k))
    scores = np.matmul(queries, keys.swapaxes(1, 2)) / _scale(d_k, scale)
    w = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return float((w / w.sum(axis=-1, keepdims=True)).max(axis=-1).mean())
