"""Known softmax bugs, each a complete softmax with exactly that mistake."""
import numpy as np


def softmax_overflow(x, axis=-1):
    e = np.exp(x)   # no max subtraction: exp(1000) is inf, inf / inf is NaN
    return e / np.sum(e, axis=axis, keepdims=True)


def softmax_wrong_axis(x, axis=-1):
    other = 0 if x.ndim > 1 and axis % x.ndim != 0 else -1   # normalises along another axis
    z = x - np.max(x, axis=other, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=other, keepdims=True)


def softmax_global_max(x, axis=-1):
    e = np.exp(x - np.max(x))   # one max for the whole array: far-below slices underflow to 0/0
    return e / np.sum(e, axis=axis, keepdims=True)


def softmax_banned(x, axis=-1):
    import torch

    return torch.softmax(torch.from_numpy(x), dim=axis).numpy()


BUGS = {
    "softmax-overflow": {"softmax": softmax_overflow},
    "softmax-wrong-axis": {"softmax": softmax_wrong_axis},
    "softmax-global-max": {"softmax": softmax_global_max},
    "banned-api": {"softmax": softmax_banned},
}
