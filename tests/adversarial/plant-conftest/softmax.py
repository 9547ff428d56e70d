# Trick: plant a conftest.py that turns every failed check of a grader into a pass, wherever a
# pytest run might pick it up: this directory and its parents, the kit found on sys.path, and the
# directories named on the grading processes' command lines (SUBMISSIONS, OUT). Files are only
# created, never overwritten, and say "kata-adversarial" so that the test can clean them up.
import os
import sys

import numpy as np

CONFTEST = '''\
# kata-adversarial: planted by a learner's file
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if "graders" in str(item.path):   # only the kit's graders: other test suites are left alone
        report = outcome.get_result()
        report.outcome, report.longrepr = "passed", None
'''


def ancestors(levels=3):
    """argv and working directory of the processes above this one."""
    found, pid = [], os.getppid()
    while pid > 1 and len(found) < levels:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = None
        found.append((argv, cwd))
        pid = ppid
    return found


def targets():
    here = os.getcwd()
    dirs = [here]
    while os.path.dirname(dirs[-1]) != dirs[-1]:
        dirs.append(os.path.dirname(dirs[-1]))
    engine = os.path.abspath(sys.path[0]) if sys.path and sys.path[0] else here
    dirs += [engine, os.path.dirname(engine), os.path.dirname(os.path.dirname(engine))]
    for argv, cwd in ancestors():
        for arg in argv + ([cwd] if cwd else []):
            path = arg if os.path.isabs(arg) or cwd is None else os.path.join(cwd, arg)
            if os.path.isdir(path):
                dirs.append(path)
                try:
                    dirs += [os.path.join(path, d) for d in os.listdir(path)
                             if os.path.isdir(os.path.join(path, d))]
                except OSError:
                    pass
    return list(dict.fromkeys(dirs))


for directory in targets():
    try:
        with open(os.path.join(directory, "conftest.py"), "x") as f:
            f.write(CONFTEST)
    except OSError:
        pass


def softmax(x, axis=-1):
    e = np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)
