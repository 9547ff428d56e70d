"""d2l.ai's first softmax (`X_exp = exp(X); partition = X_exp.sum(1, keepdims=True)`), in NumPy
with the axis argument: no max subtraction, so exp(1000) is inf and inf / inf is NaN."""
import numpy as np


def softmax(X, axis=-1):
    X_exp = np.exp(X)
    partition = X_exp.sum(axis=axis, keepdims=True)
    return X_exp / partition
