"""The sandbox's containment, looked at directly (tests/test_adversarial.py plays the learners'
tricks through `kata grade`): bubblewrap's view of the filesystem, a pid namespace per worker,
private /tmp and /dev/shm, memory capped for the whole process tree, a process limit, and replies
bounded before they are read. The view is checked as root and as a non-root user that the test
runs the kit as."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest

from graders.engine.failures import SandboxFailed
from graders.engine.learner import Learner
from graders.engine.manifest import ROOT
from graders.engine.sandbox import Sandbox, Zygote
from graders.engine.worker import encode_frame

from conftest import AS_ROOT, WHO, as_user, needs_bwrap

pytestmark = needs_bwrap


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
    assert uid == euid == gid != 0 and groups == []


# Each way to start a process; the child would write to the learner's pipe if it ran at all.
STARTERS = {
    "fork": "def start(w):\n    if os.fork() == 0:\n        os.write(w, b'1')\n        os._exit(0)\n",
    "a daemon": ("def start(w):\n    if os.fork() == 0:\n        os.setsid()\n        if os.fork() == 0:\n"
                 "            os.write(w, b'1')\n            time.sleep(60)\n        os._exit(0)\n"),
    "subprocess": "def start(w):\n    subprocess.run(['sh', '-c', f'echo 1 >&{w}'], pass_fds=[w])\n",
    "posix_spawn": "def start(w):\n    os.posix_spawn('/bin/sh', ['sh', '-c', f'echo 1 >&{w}'], dict(os.environ))\n",
    "multiprocessing": ("def start(w):\n    p = multiprocessing.Process(target=os.write, args=(w, b'1'))\n"
                        "    p.start()\n    p.join()\n"),
}


@pytest.mark.parametrize("how", STARTERS)
def test_a_worker_that_starts_a_process_is_stopped(learner_for, how):
    # Memory and CPU time of a process tree are capped by sampling it: a child that fills its
    # memory while its parent waits could be caught in one run and not the next. So no process.
    source = ("import multiprocessing, os, subprocess, time\n" + STARTERS[how] +
              "def run():\n    r, w = os.pipe()\n    os.set_blocking(r, False)\n    try:\n        start(w)\n"
              "        time.sleep(0.5)\n        return os.read(r, 8)\n    except BlockingIOError:\n"
              "        return b''\ndef fine():\n    return 2\n")
    learner, sandbox = learner_for(source)
    with pytest.raises(SandboxFailed, match=r"Your code started a process during run\(\), which the sandbox does not allow"):
        learner.run()
    assert learner.fine() == 2   # the next call gets a fresh worker
    assert len(sandbox.proc.tree()) == 1


def test_a_thread_bomb_hits_the_process_limit(learner_for):
    source = ("import threading, time\ndef bomb():\n    n = 0\n    try:\n        for _ in range(2000):\n"
              "            threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
              "            n += 1\n    except RuntimeError:\n        pass\n    return n\n")
    learner, _ = learner_for(source, memory_mb=8192)   # 64 threads' stacks: memory is not what stops them
    assert learner.bomb() < 64


def test_threads_share_their_process_data_limit(learner_for):
    # Each thread asks for less than the limit; together they pass it, and the kernel refuses the
    # allocation that would, whenever it comes: the same count on every run.
    source = ("import threading\nblocks = []\ndef take():\n    try:\n        blocks.append(bytearray(300 << 20))\n"
              "    except MemoryError:\n        pass\ndef hog():\n    threads = [threading.Thread(target=take) for _ in range(4)]\n"
              "    for t in threads:\n        t.start()\n    for t in threads:\n        t.join()\n    return len(blocks)\n")
    learner, _ = learner_for(source, memory_mb=512)
    assert learner.hog() == 1   # 300 MB fits under 512 MB with the worker's own, 600 MB does not


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


@pytest.mark.parametrize("who", WHO)
def test_the_sandbox_sees_python_and_nothing_of_the_kit_the_class_or_home(who, tmp_path):
    user = as_user(who)
    base = Path(tempfile.mkdtemp(prefix="kata-view-"))
    try:
        folders = _class_folders(base)
        probe = base / "probe.py"
        probe.write_text(PROBE)
        os.chmod(probe, 0o644)
        secrets = [*_kit_files(), *folders["files"]]
        roots = [str(ROOT), str(base), "/root", "/home"]
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


# --- the seccomp filter, the sandbox users and the view, as root and as a non-root user ------------

RUN_LEARNER = r'''
import json, sys
from pathlib import Path
from graders.engine.learner import Learner
from graders.engine.sandbox import Sandbox, Zygote
from graders.engine.failures import SandboxFailed
source, calls, options = Path(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
exec(sys.argv[4])   # the trusted side's own set-up, before any sandbox exists
answers = []
with Zygote([options["framework"]]) as zygote:
    for sandbox_calls in calls:   # one sandbox each
        with Sandbox(source, zygote=zygote, module_name="attack", timeout_s=20, import_timeout_s=60,
                     **options) as sandbox:
            learner = Learner(sandbox.start())
            for name, args in sandbox_calls:
                measured, _, name = name.rpartition(" ")   # "peak_bytes f": learner.peak_bytes(learner.f, ...)
                try:
                    call = getattr(learner, name)
                    answers.append(getattr(learner, measured)(call, *args) if measured else call(*args))
                except SandboxFailed as exc:
                    answers.append({"stopped": str(exc)})
print(json.dumps(answers))
'''

def attack(who: str, source: str, calls, *, setup: str = "", root: Path = ROOT, **options) -> list:
    """What ``source``'s functions answered, each list of ``calls`` [(name, args)] in a sandbox of its
    own (Sandbox's ``options``), all under one zygote that a process of ``who`` started (after
    running ``setup``)."""
    options = {"framework": "numpy", "memory_mb": 1024, **options}
    user = as_user(who)
    folder = Path(tempfile.mkdtemp(prefix="kata-attack-"))
    try:
        os.chmod(folder, 0o755)
        path = folder / "attack.py"
        path.write_text(source)
        os.chmod(path, 0o644)
        done = subprocess.run([sys.executable, "-c", RUN_LEARNER, str(path), json.dumps(calls), json.dumps(options), setup],
                              cwd=root, env={"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}, capture_output=True,
                              text=True, timeout=300, **user)
    finally:
        subprocess.run(["rm", "-rf", str(folder)])
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def syscall_numbers(*names) -> dict:
    import pyseccomp

    return {name: pyseccomp.resolve_syscall(pyseccomp.system_arch(), name) for name in names}


KEYS = syscall_numbers("add_key", "request_key", "keyctl")
KEYRING = '''
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
KEYCTL_READ, SESSION, USER = 11, -3, -4

def read_key(n, description):
    """The payload of the key with this description, from any keyring this process can search."""
    serial = libc.syscall(n["request_key"], b"user", description.encode(), None, 0)
    if serial < 0:
        return "refused"
    buffer = ctypes.create_string_buffer(256)
    size = libc.syscall(n["keyctl"], KEYCTL_READ, serial, buffer, 256)
    return buffer.raw[:size].decode() if size >= 0 else "refused"

def stash(n, description, payload):
    """Leave a key where another sandbox might find it: the user and the session keyrings."""
    found = [libc.syscall(n["add_key"], b"user", description.encode(), payload.encode(), len(payload), ring)
             for ring in (USER, SESSION)]
    return ["refused" if serial < 0 else "stashed" for serial in found]
'''
# The trusted side's own secret, in its session keyring (a grader's token, say): the sandbox
# inherits that keyring unless it gets one of its own.
GRADER_KEY = '''
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall({add_key}, b"user", b"kata-grader-secret", b"s3cret", 6, -3)
'''.format(**KEYS)


@pytest.mark.parametrize("who", WHO)
def test_the_kernel_keyrings_are_out_of_reach(who):
    """keyctl is not namespaced: without the filter a learner read the grader's key, and a file
    with no softmax in it scored full marks from a classmate's source left in a shared keyring."""
    answers = attack(who, KEYRING, [[("read_key", [KEYS, "kata-grader-secret"]),
                                     ("stash", [KEYS, "kata-classmate", "def softmax(x): ..."])],
                                    [("read_key", [KEYS, "kata-classmate"])]], setup=GRADER_KEY)
    assert answers == ["refused", ["refused", "refused"], "refused"]


ESCAPES = syscall_numbers("unshare", "setns", "mount", "ptrace", "bpf", "perf_event_open", "userfaultfd",
                          "clone", "clone3", "keyctl", "open_by_handle_at", "process_vm_readv")
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x20000
SYSCALLS = '''
import ctypes
libc = ctypes.CDLL(None, use_errno=True)

def attempt(n):
    """errno of each call a container may not make (0: it was made)."""
    calls = {"unshare(CLONE_NEWUSER)": (n["unshare"], %d), "unshare(CLONE_NEWNS)": (n["unshare"], %d),
             "clone(CLONE_NEWUSER)": (n["clone"], %d, 0, 0, 0, 0), "clone3": (n["clone3"], 0, 0),
             "setns": (n["setns"], 0, 0), "mount": (n["mount"], b"none", b"/tmp", b"tmpfs", 0, None),
             "ptrace(PTRACE_TRACEME)": (n["ptrace"], 0, 0, 0, 0), "bpf": (n["bpf"], 0, 0, 0),
             "perf_event_open": (n["perf_event_open"], 0, 0, -1, -1, 0), "userfaultfd": (n["userfaultfd"], 0),
             "open_by_handle_at": (n["open_by_handle_at"], -100, 0, 0),
             "process_vm_readv": (n["process_vm_readv"], 1, 0, 0, 0, 0, 0),
             "keyctl(KEYCTL_JOIN_SESSION_KEYRING)": (n["keyctl"], 1, None)}
    found = {}
    for what, (number, *args) in calls.items():
        ctypes.set_errno(0)
        done = libc.syscall(number, *args)
        found[what] = ctypes.get_errno() if done < 0 else 0
    return found
''' % (CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWUSER)


@pytest.mark.parametrize("who", WHO)
def test_namespaces_mounts_tracing_and_the_kernels_other_doors_are_refused(who):
    import errno

    found = attack(who, SYSCALLS, [[("attempt", [ESCAPES])]])[0]
    expected = {what: errno.ENOSYS if what == "clone3" else errno.EPERM for what in found}
    assert found == expected


@pytest.mark.skipif(not AS_ROOT, reason="as root, each sandbox runs as an unprivileged user of its own")
def test_each_sandbox_runs_as_a_user_of_its_own():
    ids = "import os\ndef ids():\n    return [os.getuid(), os.getgid(), os.getgroups()]\n"
    first, second, third = attack("caller", ids, [[("ids", [])]] * 3)
    assert len({first[0], second[0], third[0]}) == 3 and 0 not in (first[0], second[0], third[0])
    assert all(uid == gid and groups == [] for uid, gid, groups in (first, second, third))


HOLDERS = '''
import fcntl, mmap, os, socket, time
F_SETPIPE_SZ = 1031
MB = b"x" * (1 << 20)   # written a megabyte at a time: the data-size limit is the cap too
kept = []

def memfd(mb):
    fd = os.memfd_create("hoard")
    for _ in range(mb):
        os.write(fd, MB)
    kept.append(fd)

def sockets(mb):
    for _ in range(mb):
        a, b = socket.socketpair()
        a.setblocking(False)
        a.send(MB)
        kept.append((a, b))

def shm(mb):   # SysV shared memory, through the syscall: Python's own modules use POSIX shm
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.shmget(0, mb << 20, 0o1600) < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))

def tmpfs(mb):
    for folder in ("/dev/shm", "/tmp"):
        with open(os.path.join(folder, "hoard"), "wb") as f:
            for _ in range(mb // 2):
                f.write(MB)

def pipes(mb):
    while mb > 0:
        r, w = os.pipe()
        fcntl.fcntl(w, F_SETPIPE_SZ, 1 << 20)
        os.set_blocking(w, False)
        try:
            while True:
                os.write(w, b"x" * 65536)
        except BlockingIOError:
            pass
        kept.append((r, w))
        mb -= 1

def hold(kind, mb):
    """Hold ``mb`` MB the ``kind`` way for two seconds (long enough to be looked at)."""
    try:
        globals()[kind](mb)
    except OSError as exc:
        return f"refused: {exc.strerror}"
    time.sleep(2)
    return "held"
'''


@pytest.mark.serial   # a memory cap, judged with no other test's memory beside it
@pytest.mark.parametrize("who", WHO)
def test_memory_held_outside_the_processes_counts_or_is_refused(who):
    """Pages the processes' resident memory does not show: memfd, socket buffers and SysV
    shared memory are refused; files in the private tmpfs and bytes waiting in pipes count toward
    the cap (here 48 MB of them, with the worker's own 30 MB or so, against a cap of 64 MB)."""
    kinds = ["memfd", "sockets", "shm", "tmpfs", "pipes"]
    answers = attack(who, HOLDERS, [[("hold", [kind, 48])] for kind in kinds], memory_mb=64)
    found = dict(zip(kinds, answers))
    assert all(found[kind] == "refused: Operation not permitted" for kind in ("memfd", "sockets", "shm")), found
    assert all("more than the sandbox's 64 MB of memory" in found[kind]["stopped"] for kind in ("tmpfs", "pipes")), found


LOOK = "import os\ndef look(paths):\n    return [p for p in paths if os.path.exists(p)]\n"


@pytest.mark.skipif(not AS_ROOT, reason="installs the kit under /usr, which only root may write")
@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("under", ["/usr/local/src", "/usr/lib"])
def test_a_kit_installed_under_usr_is_out_of_sight(who, under):
    """/usr/local/src is where a checkout often lies, and /usr/lib is bound whole: neither shows
    the kit's reference, graders or tests to learner code."""
    tracked = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True).stdout
    copy = Path(tempfile.mkdtemp(prefix="kata-kit-", dir=under))
    try:
        for name in tracked.decode().split("\0"):
            if name and (ROOT / name).is_file():
                (copy / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / name, copy / name)
        for path in [copy, *copy.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        secrets = [str(copy / "reference" / "softmax.py"), str(copy / "graders" / "softmax.py"),
                   str(copy / "tests" / "zoo"), str(copy / "pyproject.toml")]
        assert attack(who, LOOK, [[("look", [secrets])]], root=copy) == [[]]
    finally:
        shutil.rmtree(copy)


SPAWNERS = '''
import os, threading, torch

def thread():
    out = []
    worker = threading.Thread(target=lambda: out.append(torch.ones(3).sum().item()))
    worker.start()
    worker.join()
    return out

def process():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    return os.waitpid(pid, 0)[1]

def own_thread():
    return torch.ones(3).sum().item()
'''


@pytest.mark.parametrize("who", WHO)
def test_a_torch_kata_worker_is_stopped_when_it_starts_a_thread_or_a_process(who):
    """A structure check records the torch calls of the learner's thread: work done in a thread or
    a forked child would go unseen, so a torch kata's worker may start neither."""
    answers = attack(who, SPAWNERS, [[("thread", []), ("own_thread", [])], [("process", []), ("own_thread", [])]],
                     framework="torch", spawn=False)
    assert [type(answer) for answer in answers] == [dict, float, dict, float], answers
    assert all("started a thread or a process" in stopped["stopped"] for stopped in answers[::2])
    assert answers[1::2] == [3.0, 3.0]   # the next call gets a fresh worker


PEAK = '''
import numpy as np

def hoard(mb):
    """Hold ``mb`` MB for a moment, in NumPy (no tensor), then try to make the kernel forget it."""
    block = np.ones(mb << 20, dtype=np.uint8)
    del block
    for path in ("/proc/self/clear_refs", "/proc/thread-self/clear_refs"):
        try:
            with open(path, "w") as f:
                f.write("5")
        except OSError:
            pass
'''


@pytest.mark.parametrize("who", WHO)
def test_peak_memory_is_what_the_kernel_counted_whatever_the_code_does(who):
    """A grade's peak memory is read from outside the worker, from the kernel's count of its pages:
    memory no tensor holds counts, and the worker cannot reset that count (its clear_refs is not
    its to write)."""
    warm, peak = attack(who, PEAK, [[("hoard", [1]), ("peak_bytes hoard", [64])]])   # once: the code is paged in
    assert warm is None and 63 << 20 <= peak < 66 << 20   # 64 MiB, give or take what else came and went


REPLY_COST = r'''
import json, resource, sys
from pathlib import Path
from graders.engine.learner import Learner
from graders.engine.sandbox import Sandbox, Zygote
with Zygote(["numpy"]) as zygote, Sandbox(Path(sys.argv[1]), zygote=zygote, framework="numpy", module_name="big",
                                          timeout_s=60, import_timeout_s=60, memory_mb=2048) as sandbox:
    learner = Learner(sandbox.start())
    learner.big(1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    size = learner.big(200 << 20).nbytes
    print(json.dumps([size, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10) - before]))
'''


@pytest.mark.serial   # a process's peak memory, measured with nothing else beside it
def test_a_large_reply_costs_this_side_its_size_once(tmp_path):
    path = tmp_path / "big.py"
    path.write_text("import numpy as np\ndef big(n):\n    return np.ones(n, dtype=np.uint8)\n")
    done = subprocess.run([sys.executable, "-c", REPLY_COST, str(path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    size, cost = json.loads(done.stdout)
    assert size == 200 << 20 and cost < 1.2 * size   # the frame's buffer is the array: not twice, not three times


CUSTOM_OP = '''
import torch

@torch.library.custom_op("kata_attack::scores", mutates_args=())
def scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q @ k.mT   # the whole score matrix, which no recording shows

def attend(q, k):
    return scores(q, k).softmax(-1)
'''


def test_a_custom_operator_is_seen_for_what_it_is(tmp_path, zygotes):
    """Its body's torch calls are not recorded: the recording names the operator, and the structure
    checks' last judgement (structure.check_untampered) refuses it, whatever the static check said."""
    import torch

    from graders.engine.failures import CheckFailed
    from graders.engine.structure import check_untampered

    path = tmp_path / "mod.py"
    path.write_text(CUSTOM_OP)
    with Sandbox(path, zygote=zygotes("torch"), framework="torch", module_name="mod", timeout_s=20,
                 import_timeout_s=60, memory_mb=1024, spawn=False).start() as sandbox:
        learner = Learner(sandbox)
        with learner.recording() as ops:
            learner.attend(torch.randn(4, 8), torch.randn(6, 8))
        assert "matmul" not in {op["name"] for op in ops}
        assert learner.custom_operators == {"torch.ops.kata_attack.scores.default"}
        with pytest.raises(CheckFailed) as failed:
            check_untampered(learner, call="attend(q, k)")
        assert failed.value.diagnosis == "tampering"
        assert "torch.ops.kata_attack.scores.default, a custom operator" in failed.value.got


@pytest.mark.skipif(not AS_ROOT, reason="as root the sandbox user is another user, who must enter the folders")
def test_a_python_under_tmp_grades_right_whatever_the_umask(tmp_path):
    """Python installed under /tmp, as in CI's virtual environment, is bound again into each
    worker's private /tmp: the folders leading to it must let the sandbox user in however strict
    the grader's umask (027, a course's shared folder), or NumPy's lazily imported parts are lost."""
    base = Path(tempfile.mkdtemp(prefix="kata-tmp-python-", dir="/tmp"))
    try:
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        subprocess.run([str(Path(sys.base_prefix) / "bin" / version), "-m", "venv", "--without-pip",
                        str(base / "venv")], check=True)
        packages = Path(sysconfig.get_paths(vars={"base": str(base / "venv")})["purelib"])
        packages.rmdir()
        packages.symlink_to(sysconfig.get_paths()["purelib"])   # this environment's torch, NumPy and kit
        (tmp_path / "softmax.py").write_text((ROOT / "reference" / "softmax.py").read_text())
        env = {**os.environ, "NO_COLOR": "1", "KATA_WORKSPACE": str(tmp_path)}
        done = subprocess.run([str(base / "venv" / "bin" / "python"), "-c", "import cli; cli.main()",
                               "check", "softmax", "--json"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600, umask=0o027)
    finally:
        shutil.rmtree(base)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["sandbox"] == "bwrap" and result["score"] == result["max_score"], result
