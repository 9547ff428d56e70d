# Probe: a right softmax that raises instead, naming every leak, when the sandbox runs
# as root or can read what it must not (the kit's reference and graders, the submissions, OUT, the
# parent's open files, a neighbouring sandbox) or write where it must not. The test fills in the
# paths of this run below; only the sandbox's own copy of this file may be readable.
import glob
import os

import numpy as np

READ = []    # files the sandbox must not be able to open
LIST = []    # directories it must not be able to list
WRITE = []   # directories it must not be able to create a file in


def leaks():
    found = []
    if os.getuid() == 0 or os.geteuid() == 0:
        found.append(f"runs as uid {os.getuid()} / euid {os.geteuid()}")
    parent = os.getppid()
    here = os.getcwd()
    # Neighbouring sandboxes: the folders beside this one named like it but for a random suffix.
    prefix = os.path.join(os.path.dirname(here), os.path.basename(here)[:-8])
    others = ([p for p in glob.glob(prefix + "*/*") if os.path.dirname(p) != here]
              if os.path.basename(here).startswith("kata-sandbox-") else [])   # bwrap: a private /tmp
    for path in READ + [f"/proc/{parent}/environ"] + others:
        try:
            with open(path, "rb") as f:
                f.read(1)
            if os.path.isfile(path):
                found.append(f"read {path}")
        except OSError:
            pass
    for path in LIST + [f"/proc/{parent}/fd"]:
        try:
            os.listdir(path)
            found.append(f"listed {path}")
        except OSError:
            pass
    for directory in WRITE:
        path = os.path.join(directory, f"kata-adversarial-probe-{os.getpid()}")
        try:
            with open(path, "x"):
                pass
            os.unlink(path)
            found.append(f"created a file in {directory}")
        except OSError:
            pass
    return found


def softmax(x, axis=-1):
    found = leaks()
    if found:
        raise PermissionError("the sandbox could: " + "; ".join(found))
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)
