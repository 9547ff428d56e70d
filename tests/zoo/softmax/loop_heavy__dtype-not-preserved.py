"""Loop-heavy, the way a first-principles interview answer is written (move the axis last, a
Python loop over each slice with math.exp), with its output buffer made by `np.empty(shape)`:
NumPy's default dtype, float64, whatever x is.

The values are right (Python floats are float64): only the dtype check may fail, and name it.
"""
import math

import numpy as np


def softmax(x, axis=-1):
    moved = np.moveaxis(x, axis, -1)
    out = np.empty(moved.shape)
    for index in np.ndindex(moved.shape[:-1]):
        row = moved[index]
        biggest = max(float(v) for v in row)
        exps = [math.exp(float(v) - biggest) for v in row]
        total = sum(exps)
        for j, e in enumerate(exps):
            out[index + (j,)] = e / total
    return np.moveaxis(out, -1, axis)
