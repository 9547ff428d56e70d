"""`kata watch`, end to end through the installed `kata` command in a subprocess, and the Watcher's
fall-back to polling with real watchdog observers. Deadlines are generous: a check takes about a
second on a busy machine."""
import errno
import json
import os
import queue
import signal
import subprocess
import threading
import time

import pytest
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver

from graders.engine.manifest import ROOT
from graders.practice.watch import Watcher

from conftest import KATA

STUB = (ROOT / "katas" / "softmax" / "stub.py").read_text()
SOFTMAX = (ROOT / "reference" / "softmax.py").read_text()
WATCHING = "(Ctrl-C to stop)"
DEADLINE_S = 240


class WatchRun:
    """`kata watch ARGS` running in a subprocess; a reader thread collects its output."""

    def __init__(self, workspace, *args):
        env = {**os.environ, "KATA_WORKSPACE": str(workspace), "NO_COLOR": "1"}
        self.proc = subprocess.Popen([str(KATA), "watch", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=env, cwd=workspace)
        self.lines = []
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()

    @property
    def output(self) -> str:
        with self.changed:
            return "".join(self.lines)

    def wait_for(self, text: str, count: int = 1) -> str:
        """The output once ``text`` appears ``count`` times in it."""
        with self.changed:
            found = self.changed.wait_for(lambda: "".join(self.lines).count(text) >= count
                                          or self.proc.poll() is not None, timeout=DEADLINE_S)
        assert found and self.output.count(text) >= count, f"no {count} x {text!r} in:\n{self.output}"
        return self.output

    def interrupt(self) -> int:
        """Ctrl-C: the exit code."""
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=DEADLINE_S)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def watch(tmp_path):
    """Start `kata watch` on a workspace; every run is stopped at the end of the test."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    runs = []

    def start(*args, files=None):
        for name, text in (files or {"softmax.py": STUB}).items():
            (workspace / name).write_text(text)
        runs.append(WatchRun(workspace, *args))
        return runs[-1]

    start.workspace = workspace
    yield start
    for run in runs:
        run.close()


def write_in_place(path, text):
    path.write_text(text)


def rename_over(path, text):
    """Like vim and JetBrains: a temporary file, renamed over the original."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def delete_and_recreate(path, text):
    path.unlink()
    path.write_text(text)


def softmax_state(workspace) -> dict:
    return json.loads((workspace / ".kata" / "state.json").read_text())["katas"]["softmax"]


@pytest.mark.parametrize("mode, save", [
    ("events", write_in_place), ("events", rename_over), ("events", delete_and_recreate), ("poll", rename_over),
], ids=["events-in-place", "events-rename-over", "events-delete-recreate", "poll-rename-over"])
def test_a_save_is_checked_again(watch, mode, save):
    run = watch("softmax", "--seed", "5", *(["--poll", "--interval", "0.2"] if mode == "poll" else []))
    output = run.wait_for(WATCHING)
    assert "seed 5" in output and "NOT-STARTED" in output and "PASSED" not in output
    assert "Watching softmax.py (Ctrl-C to stop)" in output

    save(watch.workspace / "softmax.py", SOFTMAX)
    output = run.wait_for(WATCHING, 2)
    assert "PASSED  10/10 points" in output.split("NOT-STARTED")[1]
    assert "polling" not in output   # events arrived (or --poll was asked for): no fall-back
    assert softmax_state(watch.workspace)["status"] == "passed"   # recorded like `kata check`

    assert run.interrupt() == 0
    assert run.output.rstrip().endswith("Stopped watching.") and "Traceback" not in run.output
    assert (watch.workspace / "softmax.py").read_text() == SOFTMAX


def test_a_save_that_changes_nothing_is_not_checked_again(watch):
    run = watch("softmax")
    run.wait_for(WATCHING)
    path = watch.workspace / "softmax.py"
    write_in_place(path, STUB)
    os.utime(path)
    rename_over(path, STUB)
    time.sleep(2)   # room for a wrong re-check to begin before the real change below
    write_in_place(path, SOFTMAX)
    output = run.wait_for(WATCHING, 2)
    assert output.count("NOT-STARTED") == 1 and "PASSED" in output
    assert run.interrupt() == 0
    assert run.output.count(" · softmax.py ─") == 2   # one separator line per check


def test_without_kata_only_the_saved_file_is_checked_and_a_broken_file_does_not_stop_it(watch):
    variance = (ROOT / "katas" / "scaling-variance" / "stub.py").read_text()
    run = watch(files={"softmax.py": STUB, "scaling_variance.py": variance})
    output = run.wait_for(WATCHING)
    # In the katas' order, and nothing checked before a save.
    assert "Watching softmax.py, scaling_variance.py (Ctrl-C to stop): each is checked when you save it." in output
    assert " · " not in output and "NOT-STARTED" not in output

    write_in_place(watch.workspace / "softmax.py", "def softmax(x, axis=-1)\n    return x\n")
    output = run.wait_for(WATCHING, 2)
    assert "Your file could not be graded." in output and "ERROR" in output

    write_in_place(watch.workspace / "softmax.py", SOFTMAX)
    output = run.wait_for(WATCHING, 3)
    assert "PASSED  10/10 points" in output
    assert output.count(" · softmax.py ─") == 2 and " · scaling_variance.py ─" not in output
    assert run.interrupt() == 0 and "Traceback" not in run.output


def test_ctrl_c_during_a_check_stops_cleanly(watch):
    run = watch("softmax")
    run.wait_for(WATCHING)
    write_in_place(watch.workspace / "softmax.py", "def softmax(x, axis=-1):\n    while True:\n        pass\n")
    run.wait_for(" · softmax.py ─", 2)
    time.sleep(1)   # the check is now waiting on a call that never returns
    assert run.interrupt() == 0
    assert run.output.rstrip().endswith("Stopped watching.") and "Traceback" not in run.output


def test_a_kata_not_started_is_a_usage_error(watch):
    run = subprocess.run([str(KATA), "watch", "causal-mask"], capture_output=True, text=True,
                         cwd=watch.workspace, env={**os.environ, "KATA_WORKSPACE": str(watch.workspace)})
    assert run.returncode == 2
    assert "causal_mask.py does not exist. Run `kata start causal-mask` first." in run.stderr


def changes_in_thread(watcher: Watcher) -> queue.Queue:
    found = queue.Queue()
    threading.Thread(target=lambda: [found.put(path) for path in watcher.changes()], daemon=True).start()
    return found


class NoInotify(Observer):
    """An observer that fails to start the way watchdog does at the inotify watch limit."""

    def start(self):
        raise OSError(errno.ENOSPC, "inotify watch limit reached")


@pytest.mark.parametrize("observer, says", [
    (NoInotify, "cannot watch for change events here ([Errno 28] inotify watch limit reached); "
                "polling every 0.5 s instead"),
    # a real observer whose events do not arrive in time, as on NFS, 9p or vboxsf
    (lambda: PollingObserver(timeout=3600), "change events are not arriving from this file system; "
                                            "polling every 0.5 s instead"),
], ids=["observer-cannot-start", "events-do-not-arrive"])
def test_events_fall_back_to_polling(tmp_path, observer, says):
    path = tmp_path / "softmax.py"
    path.write_text(STUB)
    said = []
    with Watcher([path], observer=observer, say=said.append) as watcher:
        found = changes_in_thread(watcher)
        write_in_place(path, SOFTMAX)
        assert found.get(timeout=DEADLINE_S) == path
        assert said == [says]
        assert watcher.polling


OVERFLOWS = SOFTMAX.replace("x - np.max(x, axis=axis, keepdims=True)", "x")    # fails stable-for-large-logits
WIDENS = SOFTMAX.replace("return e / np.sum(e, axis=axis, keepdims=True)",
                         "return (e / np.sum(e, axis=axis, keepdims=True)).astype(np.float64)")   # dtype-preserved


def test_a_save_says_what_it_fixed_and_broke_and_a_pass_says_what_comes_next(watch):
    run = watch("softmax", "--poll", "--interval", "0.2", files={"softmax.py": OVERFLOWS})
    first = run.wait_for(WATCHING)
    assert "now passes" not in first and "now fails" not in first   # nothing to compare the first check with
    rename_over(watch.workspace / "softmax.py", WIDENS)
    second = run.wait_for(WATCHING, 2)[len(first):]
    assert "Since the last save: now passes: stable-for-large-logits; now fails: dtype-preserved; " \
           "5 checks unchanged." in second, second
    rename_over(watch.workspace / "softmax.py", SOFTMAX)
    third = run.wait_for(WATCHING, 3)[len(first) + len(second):]
    assert "Since the last save: now passes: dtype-preserved; 6 checks unchanged." in third, third
    assert "Passed. Next: kata start scaling-variance (continues the seed track)" in third, third
    assert run.interrupt() == 0
