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


def softmax_float64_out(x, axis=-1):
    x = x.astype(np.float64)   # upcast for accuracy, never cast back: float32 in, float64 out
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def softmax_float64_sum(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True, dtype=np.float64)   # a float64 sum promotes the quotient


def softmax_float64_buffer(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    out = np.empty(x.shape)   # NumPy's default dtype is float64, whatever x is
    out[...] = e / np.sum(e, axis=axis, keepdims=True)
    return out


def softmax_banned(x, axis=-1):
    import torch

    return torch.softmax(torch.from_numpy(x), dim=axis).numpy()


BUGS = {
    "softmax-overflow": {"softmax": softmax_overflow},
    "softmax-wrong-axis": {"softmax": softmax_wrong_axis},
    "softmax-global-max": {"softmax": softmax_global_max},
    "dtype-not-preserved": [{"softmax": softmax_float64_out}, {"softmax": softmax_float64_sum},
                            {"softmax": softmax_float64_buffer}],
    "banned-api": {"softmax": softmax_banned},
}
