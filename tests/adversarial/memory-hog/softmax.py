# Trick: eat memory in every call, hoping the grader (or the machine) gives way first. The sandbox's
# memory cap must stop each call: were 4 GB not stopped (a cap, so that a sandbox without one does not
# take the machine down), the call would go on and return the control's overflowing softmax.
import numpy as np

hoard = []


def softmax(x, axis=-1):
    for _ in range(40):
        hoard.append(np.ones(100 * 2**20 // 8))   # 100 MB, touched
    e = np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)
