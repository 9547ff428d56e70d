# Control: the "no max subtraction" bug. Huge logits overflow (exp(1000) is inf), so the stability
# check fails; the rest passes. Most tricks below wrap exactly this function.
import numpy as np


def softmax(x, axis=-1):
    e = np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)
