# Trick: text no UTF-8 file can hold (lone surrogates, bytes decoded with surrogateescape) in every
# channel that reaches the grader: what it prints, at import and in a call, and its stderr. One such
# print once stopped `kata grade` after grades.csv, with no summary.md and no feedback for the
# learners after it. Then the control's softmax.
import sys

import numpy as np

UNWRITABLE = "\ud800 \udcff " + bytes(range(128, 256)).decode("utf-8", "surrogateescape")
print(UNWRITABLE)
print(UNWRITABLE, file=sys.stderr)


def softmax(x, axis=-1):
    print(UNWRITABLE)
    e = np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)
