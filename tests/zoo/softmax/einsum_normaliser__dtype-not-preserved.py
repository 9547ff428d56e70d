"""einsum-heavy (the axis moved last, the normaliser summed with np.einsum("...j->...") and
applied by its reciprocal), with the normaliser accumulated in float64 as fused kernels accumulate
in a wider type, `dtype=np.float64`, and never cast back: float32 exps times a float64 reciprocal
come back float64.

The values are right: only the dtype check may fail, and name it.
"""
import numpy as np


def softmax(x, axis=-1):
    z = np.moveaxis(x, axis, -1)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    s = np.einsum("...j->...", e, dtype=np.float64)[..., None]
    return np.moveaxis(e * (1 / s), -1, axis)
