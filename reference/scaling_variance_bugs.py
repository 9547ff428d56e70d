"""Known scaling-variance bugs, each the reference with exactly that mistake."""
import numpy as np

from reference import scaling_variance as ref


def score_variance(d_k, scale="sqrt"):
    return ref.score_std(d_k, scale) ** 2   # Var(q·k / s) = d_k / s², where its square root is due


def sample_score_variance(d_k, scale="sqrt", n_samples=10_000, seed=0):
    return ref.sample_score_std(d_k, scale, n_samples, seed) ** 2   # np.var where np.std is due


# "sqrt" divides by d_k and "linear" by sqrt(d_k); "none" and unknown names are left as they are.
SWAPPED = {"sqrt": "linear", "linear": "sqrt"}


def score_std_mixup(d_k, scale="sqrt"):
    return ref.score_std(d_k, SWAPPED.get(scale, scale))


def sample_score_std_mixup(d_k, scale="sqrt", n_samples=10_000, seed=0):
    return ref.sample_score_std(d_k, SWAPPED.get(scale, scale), n_samples, seed)


def mean_max_weight_mixup(d_k, n_keys=16, scale="sqrt", n_trials=2_000, seed=0):
    return ref.mean_max_weight(d_k, n_keys, SWAPPED.get(scale, scale), n_trials, seed)


def mean_max_weight_over_queries(d_k, n_keys=16, scale="sqrt", n_trials=2_000, seed=0):
    s = ref._divisor(d_k, scale)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_trials, d_k, 1))        # (N, d_k, 1)
    k = rng.standard_normal((n_trials, n_keys, d_k))   # (N, n_keys, d_k)
    scores = (k @ q)[..., 0] / s                       # (N, n_keys): one query per trial
    e = np.exp(scores - scores.max(axis=0, keepdims=True))   # over the trials' queries, not each one's keys
    return float(np.mean((e / e.sum(axis=0, keepdims=True)).max(axis=-1)))


BUGS = {
    "variance-not-std": {"score_std": score_variance, "sample_score_std": sample_score_variance},
    "scale-mixup": {"score_std": score_std_mixup, "sample_score_std": sample_score_std_mixup,
                    "mean_max_weight": mean_max_weight_mixup},
    "softmax-wrong-dim": {"mean_max_weight": mean_max_weight_over_queries},
}
