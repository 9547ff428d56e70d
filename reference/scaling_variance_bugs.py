"""Known scaling-variance bugs, each the reference with exactly that mistake."""
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


BUGS = {
    "variance-not-std": {"score_std": score_variance, "sample_score_std": sample_score_variance},
    "scale-mixup": {"score_std": score_std_mixup, "sample_score_std": sample_score_std_mixup,
                    "mean_max_weight": mean_max_weight_mixup},
}
