"""The sandbox of graded runs, as root: an unprivileged user of its own, no reading of the kit or of
other files, no surviving processes, no fork bomb. (tests/test_adversarial.py plays the learner's
tricks through `kata grade`; these tests look at the mechanisms themselves.)"""
import os
import time

import pytest

from graders.engine.batch import protect
from graders.engine.failures import LearnerRaised, SandboxFailed
from graders.engine.learner import Learner
from graders.engine.manifest import ROOT
from graders.engine.sandbox import Sandbox, Zygote

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the privilege drop happens only when grading as root")


@pytest.fixture(scope="module")
def zygote():
    with Zygote(["numpy"]) as z:
        yield z


@pytest.fixture
def learner_for(tmp_path, zygote):
    sandboxes = []

    def make(source):
        path = tmp_path / "mod.py"
        path.write_text(source)
        sandbox = Sandbox(path, zygote=zygote, framework="numpy", module_name="mod", timeout_s=10,
                          import_timeout_s=10, memory_mb=1024).start()
        sandboxes.append(sandbox)
        return Learner(sandbox), sandbox

    yield make
    for sandbox in sandboxes:
        sandbox.close()


PROBES = '''
import os
def ids():
    return os.getuid(), os.geteuid(), os.getgid(), os.getgroups()
def can_read(path):
    try:
        with open(path, "rb") as f:
            f.read(1)
        return True
    except OSError:
        return False
def can_write(folder):
    try:
        with open(os.path.join(folder, "planted.py"), "w") as f:
            f.write("x = 1")
        return True
    except OSError:
        return False
'''


@as_root
def test_learner_code_runs_as_an_unprivileged_user_of_its_own(learner_for, zygote):
    learner, _ = learner_for(PROBES)
    uid, euid, gid, groups = learner.ids()
    assert uid == euid == gid == zygote.uid != 0 and groups == []


@as_root
def test_learner_code_cannot_read_the_reference_graders_or_protected_folders(learner_for, tmp_path):
    secret = tmp_path / "out"
    secret.mkdir()
    (secret / "grades.csv").write_text("learner,total\n")
    protect([ROOT / "reference", ROOT / "graders", secret])
    learner, _ = learner_for(PROBES)
    for path in (ROOT / "reference" / "softmax.py", ROOT / "graders" / "softmax.py", secret / "grades.csv"):
        assert path.exists() and not learner.can_read(str(path)), path
    assert learner.can_read(os.__file__), "the standard library must stay readable"
    assert not learner.can_write(str(secret)) and not (secret / "planted.py").exists()


def test_a_process_that_leaves_the_group_is_killed_with_the_sandbox(learner_for):
    source = ("import os, time\ndef escape():\n    r, w = os.pipe()\n    if os.fork() == 0:\n"
              "        os.setsid()\n        if os.fork() == 0:\n            os.write(w, b'1')\n"
              "            time.sleep(60)\n        os._exit(0)\n    return int(os.read(r, 32))\n")
    learner, sandbox = learner_for(source)
    assert learner.escape() == 1
    tree = sandbox.proc.tree()   # pids on this side: the worker and the daemon it left
    assert len(tree) >= 2
    sandbox.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(map(_alive, tree)):
        time.sleep(0.05)
    assert not any(map(_alive, tree))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"   # a zombie is dead, only not yet reaped
    except (FileNotFoundError, IndexError):
        return False


@as_root
def test_a_fork_bomb_hits_the_process_limit(learner_for):
    source = ("import os, time\ndef bomb():\n    n = 0\n    try:\n        for _ in range(2000):\n"
              "            if os.fork() == 0:\n                time.sleep(30)\n                os._exit(0)\n"
              "            n += 1\n    except OSError:\n        pass\n    return n\n")
    learner, _ = learner_for(source)
    assert learner.bomb() < 300


def test_killing_its_parent_costs_the_learner_only_that_call(learner_for):
    # The worker is process 1 of its own pid namespace: its parent is not visible (getppid() is 0,
    # and kill(0) signals only its own group, which process 1 ignores), so nothing dies.
    learner, _ = learner_for("import os, signal\ndef kill():\n    os.kill(os.getppid(), signal.SIGKILL)\n    return 1\n"
                             "def fine():\n    return 2\n")
    assert learner.kill() == 1 and learner.fine() == 2
    again, _ = learner_for("def fine():\n    return 2\n")
    assert again.fine() == 2


def _can_mount_proc() -> bool:
    """Whether this machine lets root mount a private /proc (CAP_SYS_ADMIN; not every container)."""
    import ctypes

    pid = os.fork()
    if pid == 0:
        libc = ctypes.CDLL(None)
        ok = libc.unshare(0x20000) == 0 and libc.mount(None, b"/", None, (1 << 14) | (1 << 18), None) == 0 \
            and libc.mount(b"proc", b"/proc", b"proc", 14, b"hidepid=2") == 0
        os._exit(0 if ok else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


@as_root
def test_learner_code_sees_no_other_process_and_no_command_line_of_the_grader(learner_for):
    if not _can_mount_proc():
        pytest.skip("this container does not let root mount a private /proc")
    source = ("import os\ndef look():\n    try:\n        parent = open(f'/proc/{os.getppid()}/cmdline', 'rb').read()\n"
              "    except OSError:\n        parent = b''\n"
              "    others = [p for p in os.listdir('/proc') if p.isdigit() and os.stat(f'/proc/{p}').st_uid != os.getuid()]\n"
              "    return len(parent), len(others)\n")
    learner, _ = learner_for(source)
    assert learner.look() == (0, 0)
