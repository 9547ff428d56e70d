import numpy as np


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax of ``x`` along ``axis``: every slice along ``axis`` becomes a probability distribution.

    Returns an array of the same shape and dtype (float32 or float64). Must stay finite for huge
    logits, give an ``-inf`` logit weight exactly 0, and leave ``x`` unmodified.
    """
    # Subtracting the slice's max changes nothing mathematically (it cancels in the ratio) but
    # keeps exp() <= 1, so huge logits cannot overflow. keepdims makes it broadcast back.
    z = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)
