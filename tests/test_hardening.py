"""The sandbox's containment, looked at directly (tests/test_adversarial.py plays the learners'
tricks through `kata grade`): bubblewrap's view of the filesystem, a pid namespace per worker,
private /tmp and /dev/shm, memory capped for the whole process tree, a process limit, and replies
bounded before they are read. The view is checked as root and as a non-root user that the test
runs the kit as."""
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from graders.engine.failures import SandboxFailed
from graders.engine.learner import Learner
from graders.engine.manifest import ROOT
from graders.engine.sandbox import Sandbox, Zygote
from graders.engine.worker import encode_frame

from conftest import needs_bwrap

pytestmark = needs_bwrap

AS_ROOT = os.geteuid() == 0
OTHER_UID = 64123   # the non-root user the kit runs as when the tests run as root


@pytest.fixture(scope="module")
def zygote():
    with Zygote(["numpy"]) as z:
        yield z


@pytest.fixture
def learner_for(tmp_path, zygote):
    sandboxes = []

    def make(source, memory_mb=1024):
        path = tmp_path / "mod.py"
        path.write_text(source)
        sandbox = Sandbox(path, zygote=zygote, framework="numpy", module_name="mod", timeout_s=10,
                          import_timeout_s=10, memory_mb=memory_mb).start()
        sandboxes.append(sandbox)
        return Learner(sandbox), sandbox

    yield make
    for sandbox in sandboxes:
        sandbox.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"   # a zombie is dead, only not yet reaped
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.skipif(not AS_ROOT, reason="as root, each grading process has a sandbox user of its own")
def test_learner_code_runs_as_an_unprivileged_user_of_its_own(learner_for, zygote):
    learner, _ = learner_for("import os\ndef ids():\n    return os.getuid(), os.geteuid(), os.getgid(), os.getgroups()\n")
    uid, euid, gid, groups = learner.ids()
    assert uid == euid == gid == zygote.uid != 0 and groups == []


def test_a_daemon_dies_with_its_worker(learner_for):
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


def test_a_fork_bomb_hits_the_process_limit(learner_for):
    source = ("import os, time\ndef bomb():\n    n = 0\n    try:\n        for _ in range(2000):\n"
              "            if os.fork() == 0:\n                time.sleep(30)\n                os._exit(0)\n"
              "            n += 1\n    except OSError:\n        pass\n    return n\n")
    learner, _ = learner_for(source, memory_mb=8192)   # 64 copies of the worker: memory is not what stops them
    assert learner.bomb() < 64


@pytest.mark.serial   # a memory cap, judged with no other test's memory beside it
def test_memory_held_by_child_processes_counts(learner_for):
    # Each child stays under the per-process data limit; together they pass the cap.
    source = ("import os, time\ndef hog():\n    for _ in range(4):\n        if os.fork() == 0:\n"
              "            block = bytearray(200 << 20)\n            time.sleep(60)\n            os._exit(0)\n"
              "    time.sleep(30)\n")
    learner, _ = learner_for(source, memory_mb=512)
    with pytest.raises(SandboxFailed, match="memory"):
        learner.hog()


def test_killing_its_parent_costs_the_learner_nothing(learner_for):
    # The worker is process 1 of its own pid namespace: its parent is not visible (getppid() is 0,
    # and kill(0) signals only its own group, which process 1 ignores), so nothing dies.
    learner, _ = learner_for("import os, signal\ndef kill():\n    os.kill(os.getppid(), signal.SIGKILL)\n    return 1\n"
                             "def fine():\n    return 2\n")
    assert learner.kill() == 1 and learner.fine() == 2


FORGER = '''
import gc, json, os, struct
def forge(header, blob=""):
    worker = next(o for o in gc.get_objects() if type(o).__name__ == "Worker")
    data = header.encode()
    os.write(worker.resp_fd, struct.pack(">I", len(data)) + data + blob.encode("latin-1"))
    return 1
'''


def test_a_deeply_nested_reply_is_malformed_not_a_crash(learner_for):
    learner, _ = learner_for(FORGER)
    with pytest.raises(SandboxFailed, match="malformed reply"):
        learner.forge('{"ok": true, "blobs": [], "value": ' + "[" * 100_000 + "]" * 100_000 + "}")


def test_an_array_header_claiming_more_than_its_data_is_refused(learner_for):
    import io

    import numpy as np

    blob = io.BytesIO()
    np.save(blob, np.zeros(1))
    forged = blob.getvalue().replace(b"(1,)", b"(100000, 100000)")   # 80 GB claimed, 8 bytes sent
    header = json.dumps({"ok": True, "blobs": [len(forged)], "value": {"ndarray": 0}})
    learner, _ = learner_for(FORGER)
    with pytest.raises(SandboxFailed, match="malformed value"):
        learner.forge(header, forged.decode("latin-1"))


# --- what the sandbox can see, as root and as a non-root user ---------------------------------------

PROBE = '''
import os
def look(paths):
    return {p: os.path.exists(p) for p in paths}
def listing(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return None
def processes():
    return sorted(p for p in os.listdir("/proc") if p.isdigit())
def scratch():
    found = {d: sorted(os.listdir(d)) for d in ("/tmp", "/dev/shm")}
    for d in ("/tmp", "/dev/shm"):
        with open(os.path.join(d, "left-behind"), "w") as f:
            f.write("x")
    try:   # fill /tmp: the private tmpfs is full, nothing else is
        with open("/tmp/fill", "wb") as f:
            while True:
                f.write(b"x" * (1 << 20))
    except OSError as exc:
        found["full"] = exc.errno
    return found
'''

RUN_PROBE = r'''
import json, os, sys
from pathlib import Path
from graders.engine.learner import Learner
from graders.engine.sandbox import Sandbox, Zygote
probe, paths, roots = Path(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
seen = {}
with Zygote(["numpy"]) as zygote:
    for pair in (1, 2):
        with Sandbox(probe, zygote=zygote, framework="numpy", module_name="probe", timeout_s=20,
                     import_timeout_s=60, memory_mb=1024) as sandbox:
            learner = Learner(sandbox.start())
            seen[pair] = {"exists": learner.look(paths), "listings": {r: learner.listing(r) for r in roots},
                          "processes": learner.processes(), "scratch": learner.scratch(),
                          "uid": learner.look([])}
print(json.dumps(seen))
'''


def _class_folders(base: Path) -> dict[str, Path]:
    """A class as an instructor has it, readable by every user (so that only the sandbox hides it)."""
    folders = {"submissions": base / "submissions", "out": base / "out", "course": base / "course",
               "home": base / "home"}
    files = [folders["submissions"] / "alice" / "softmax.py", folders["out"] / "grades.csv",
             folders["course"] / "source" / "a1" / "softmax.ipynb", folders["home"] / ".bashrc"]
    for file in files:
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text("secret\n")
    for path in [base, *base.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return {**folders, "files": files}


def _kit_files() -> list[Path]:
    """Every copy of the kit's answers this machine holds: the checkout's, its git objects, and
    an installed copy (site-packages) if there is one."""
    import importlib.util

    files = [ROOT / "reference" / "softmax.py", ROOT / "graders" / "softmax.py", ROOT / ".git" / "HEAD"]
    spec = importlib.util.find_spec("reference")
    if spec is not None and spec.origin:
        files.append(Path(spec.origin).with_name("softmax.py"))
    return [f for f in files if f.exists()]


@pytest.mark.parametrize("who", ["caller", "non-root"])
def test_the_sandbox_sees_python_and_nothing_of_the_kit_the_class_or_home(who, tmp_path):
    if who == "non-root" and not AS_ROOT:
        pytest.skip("the caller is the non-root user already")
    base = Path(tempfile.mkdtemp(prefix="kata-view-"))
    try:
        folders = _class_folders(base)
        probe = base / "probe.py"
        probe.write_text(PROBE)
        os.chmod(probe, 0o644)
        secrets = [*_kit_files(), *folders["files"]]
        roots = [str(ROOT), str(base), "/root", "/home"]
        user = {}
        if who == "non-root":
            user = {"user": OTHER_UID, "group": OTHER_UID, "extra_groups": []}
            try:
                reached = subprocess.run([sys.executable, "-c", "import graders.engine.sandbox"], cwd=ROOT, **user,
                                         capture_output=True).returncode == 0
            except PermissionError:   # not even the interpreter
                reached = False
            if not reached:
                pytest.skip("another user cannot run this Python or read the checkout "
                            "(.ci/run makes them reachable)")
        env = {"PATH": os.environ["PATH"], "HOME": str(folders["home"]), "LANG": "C.UTF-8"}
        done = subprocess.run([sys.executable, "-c", RUN_PROBE, str(probe), json.dumps(list(map(str, secrets))),
                               json.dumps(roots)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                              **user)
        assert done.returncode == 0, done.stderr[-3000:]
        seen = json.loads(done.stdout)
    finally:
        subprocess.run(["rm", "-rf", str(base)])
    for pair in ("1", "2"):
        assert not any(seen[pair]["exists"].values()), seen[pair]["exists"]
        listings = seen[pair]["listings"]
        assert listings[str(base)] is None   # the class's folders are not there at all
        assert not {"reference", "graders", ".git", "katas"} & set(listings[str(ROOT)] or [])
        assert seen[pair]["processes"] == ["1"]   # only itself
    # The first pair's files are gone at the second, and filling /tmp only filled its own. (A
    # Python installed under /tmp, as CI's is, shows there as the folder that leads to it.)
    from graders.engine import bwrap

    python = {Path(arg).parts[2] for arg in bwrap.command(["numpy"]) if arg.startswith("/tmp/")}
    for pair in ("1", "2"):
        assert set(seen[pair]["scratch"]["/tmp"]) - python == {"probe.py"}
    assert seen["2"]["scratch"]["/dev/shm"] == []
    assert seen["1"]["scratch"]["full"] in (28, 27)   # ENOSPC, or EFBIG from the file-size limit
