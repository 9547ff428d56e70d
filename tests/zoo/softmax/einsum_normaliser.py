"""einsum-heavy: the axis moved last with np.moveaxis, the normaliser summed with
np.einsum("...j->..."), and applied by multiplying with its reciprocal (`e * (1 / s)`), as fused
GPU kernels do.

What a grader could get wrong: `e * (1 / s)` rounds twice where `e / s` rounds once, so weights
differ from the reference's in the last bit; only rtol, not bit equality, can accept it.
"""
import numpy as np


def softmax(x, axis=-1):
    z = np.moveaxis(x, axis, -1)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    s = np.einsum("...j->...", e)[..., None]
    return np.moveaxis(e * (1 / s), -1, axis)
