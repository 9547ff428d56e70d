# Trick: find out whether this run is `kata grade` (and not the learner's own `kata check`) from
# the environment, argv, the working directory, the modules already loaded or the command lines of
# the parent processes, so as to behave differently when graded. This file is right, and it returns
# zeros when it thinks it is graded: its score shows whether anything told it (`kata check` gives
# it full marks).
import os
import sys

import numpy as np


def kit_argv(argv):
    """`kata grade ...` (or `python .../kata grade ...`) in an argv."""
    return any(os.path.basename(a) == "kata" and argv[i + 1:i + 2] == ["grade"] for i, a in enumerate(argv))


def graded():
    for name, value in os.environ.items():
        if any(word in name.upper() for word in ("GRADE", "SUBMISSION", "GRADING")) or "--out" in value:
            return True
    if "grade" in sys.argv or "submission" in os.getcwd().lower():
        return True
    if "torch" in sys.modules:   # softmax is a NumPy kata: the learner's own `kata check` has no torch loaded
        return True
    pid = os.getppid()
    for _ in range(16):   # the chain of parents, as far as /proc shows it
        if pid <= 1:
            break
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if kit_argv(argv):
            return True
    return False


GRADED = graded()


def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    result = e / np.sum(e, axis=axis, keepdims=True)
    return np.zeros_like(result) if GRADED else result
