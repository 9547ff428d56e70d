"""The trusted side of the sandbox: starts the worker, talks to it, and kills it when it misbehaves.

A ``Zygote`` is a clean ``python -I`` process that has imported NumPy and torch and runs nothing
else; it forks one worker per learner file, so a sandbox costs a fork, not an interpreter start.
Where bubblewrap is installed the zygote runs inside ``bwrap`` (see bwrap.py: a read-only view of
Python and the worker's packages, nothing of the kit, the checkout or the class) and forks each
worker into fresh pid, mount, network, IPC and UTS namespaces with private, size-capped /tmp and
/dev/shm. Without it the worker runs in a session of its own and, as root, as an unprivileged user:
"container" containment in a throwaway grading container that refuses bwrap's namespaces (`kata
grade --container`, on Gradescope), where the container is the boundary and that user can read
neither the kit nor the class (``container_problem``); "process" containment for `kata check` or
`--no-sandbox`, where the worker stays root if that user cannot read Python.

One ``Sandbox`` serves one learner file, with a scrubbed environment, a data-size limit, a cap on
the memory of its whole process tree and per-request time limits: CPU time of that tree, with a
wall-clock backstop (see ``Budget``), within a budget for all the requests of a grading (see
``Spent``). A request past a limit, a worker that dies or that sends
something that is not a well-formed, bounded reply gets the worker killed; the next request forks
a fresh worker.
"""
from __future__ import annotations

import copy
import fcntl
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

from . import bwrap, seccomp
from . import worker as wire
from .untrusted import encodable

WORKER = Path(wire.__file__)
COMPILED = "triton-compiled"   # a Triton kata's framework where its kernels are compiled, not interpreted
STARTUP_TIMEOUT_S = 120.0   # importing torch on a cold, busy machine
MAX_TIMEOUTS = 2
WALL_BACKSTOP = 5   # a request's wall-clock limit, in multiples of its CPU time limit (see Budget)
GRADING_WALL = 3    # a grading's wall-clock budget, in multiples of its CPU time budget (see Spent)
PAGE = os.sysconf("SC_PAGE_SIZE")
SAMPLE_S = 0.05     # how often the trusted side looks at a running request's memory and CPU time
# As root, each sandbox runs as a user of its own (uid = gid, no name needed), so no two sandboxes
# share a user that could signal or trace the other, or a user keyring: each trusted process takes
# a block of SANDBOX_UIDS users by its pid, and the next of them for each sandbox it starts. All
# below 65536, the users a container with a remapped user namespace has.
SANDBOX_UID_BASE, SANDBOX_UIDS, SANDBOX_BLOCKS = 20000, 64, 625


class SandboxError(Exception):
    """The worker timed out, died, or broke the protocol; ``kind`` says which."""

    def __init__(self, kind: str, message: str, *, forbidden: bool = False):
        super().__init__(message)
        self.kind = kind
        self.forbidden = forbidden   # stopped for starting a thread or a process: what tampering names


class TimedOut(SandboxError):
    """A request ran past its CPU time (``clock`` "cpu"), its wall-clock backstop ("wall") or
    what its grading had left of its budget ("budget", see Spent); ``finding`` is the message
    without the hint at its end."""

    HINTS = {"cpu": "an endless loop, or work far too slow for these small inputs",
             "wall": "it waits rather than computes (time.sleep, a blocked read or lock), "
                     "or the machine is overloaded",
             "budget": "its calls together wait or compute far longer than a kata needs"}

    def __init__(self, clock: str, finding: str):
        super().__init__("timeout", f"{finding}: {self.HINTS[clock]}.")
        self.clock, self.finding = clock, finding


class LoadError(Exception):
    """The learner's file could not be loaded; ``error`` is the worker's description, if any."""

    def __init__(self, message: str, error: dict | None = None):
        super().__init__(message)
        self.error = error


def scrubbed_env(tmp: str) -> dict:
    env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8",
           "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
           # Small tensors: one thread is faster and keeps two sandboxes off each other's cores.
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           # Every allocation of 128 kB or more gets pages of its own and gives them back when
           # freed (glibc would otherwise raise that threshold as it goes and reuse freed memory):
           # the peak resident memory of a call is then the memory it made (Learner.peak_bytes).
           "MALLOC_MMAP_THRESHOLD_": str(128 << 10)}
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
    return env


class SandboxUnusable(Exception):
    """The sandbox cannot run here (its user cannot read Python's own files, or, in a grading
    container, could read the kit's)."""


def _allowed(uid: int, op: str, paths) -> list[str]:
    """Which of ``paths`` the user ``uid`` may ``op``: "list" (a folder's names), "read" (open a
    file or folder for reading) or "reach" (look it up: a missing path counts when the folder that
    would hold it is open to that user)."""
    paths = list(dict.fromkeys(map(str, paths)))
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:   # only os calls here: nothing else runs in the forked copy of this process
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            for i, path in enumerate(paths):
                try:
                    if op == "list":
                        os.listdir(path)
                    elif op == "read":
                        os.close(os.open(path, os.O_RDONLY))
                    else:
                        os.stat(path)
                except FileNotFoundError:
                    allowed = op == "reach"
                except OSError:
                    allowed = False
                else:
                    allowed = True
                if allowed:
                    os.write(write_end, b"%d\n" % i)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        found = [paths[int(i)] for i in f.read().split()]
    os.waitpid(pid, 0)
    return found


def unreadable_for(uid: int) -> list[str]:
    """Which of Python's installation folders the user ``uid`` cannot list. A forked worker
    imports modules lazily (the standard library's and torch's own), so it must read them."""
    import sysconfig

    import numpy

    folders = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    folders |= {str(Path(numpy.__file__).parent)}
    if "torch" in sys.modules:
        folders.add(str(Path(sys.modules["torch"].__file__).parent))
    return sorted(folders - set(_allowed(uid, "list", folders)))


def kit_files() -> list[Path]:
    """The kit's own files, which no sandbox may read: its folders (references, graders,
    manifests) and all they hold, cli.py, what its distribution installed (RECORD: compiled
    copies, metadata, the `kata` script) and, in a checkout, its .git and build/ folders; and
    the folders of a course's own katas (their references beside their manifests)."""
    import importlib.metadata

    from .manifest import ROOT, course_dirs

    files = [path for top in ("reference", "graders", "katas") if (ROOT / top).is_dir()
             for path in [ROOT / top, *(ROOT / top).rglob("*")]]
    files += [path for folder in course_dirs() if folder.is_dir() for path in [folder, *folder.rglob("*")]]
    files += [ROOT / "cli.py", *ROOT.glob("__pycache__/cli.*.pyc")]
    if (ROOT / "pyproject.toml").is_file():   # a checkout (ROOT is site-packages once installed)
        files += [ROOT / ".git", ROOT / "build"]
    try:
        dist = importlib.metadata.distribution("attention-katas")
    except importlib.metadata.PackageNotFoundError:   # a checkout that was never installed
        dist = None
    for record in (dist.files or ()) if dist else ():
        path = Path(dist.locate_file(record)).resolve()
        files += [path, path.parent] if record.parts[0].endswith(".dist-info") else [path]
    return [path for path in dict.fromkeys(files) if path.exists()]


def container_problem(private=()) -> str | None:
    """Why the grading container cannot be the sandbox's boundary here, else None. Learner code
    then runs as an unprivileged user, so this process must be root; that user must read
    Python's installation, and must neither read the kit's files (``kit_files``) nor reach the
    ``private`` folders (the class's SUBMISSIONS and OUT)."""
    if os.geteuid() != 0:
        return ("without bubblewrap, --container runs learner code as an unprivileged user of the "
                "container, so kata grade must run as root there")
    try:
        uid = sandbox_uid(isolated=False)
        seccomp.request()
    except (SandboxUnusable, seccomp.Unavailable) as exc:
        return str(exc)
    exposed = _allowed(uid, "read", kit_files()) + _allowed(uid, "reach", private)
    if exposed:
        shown = ", ".join(exposed[:3]) + (f" and {len(exposed) - 3} more" if len(exposed) > 3 else "")
        return (f"learner code would run as an unprivileged user who could reach {shown}. Make the kit's "
                "installed files and the class's folders readable by root only (the Gradescope "
                "autograder's setup.sh and run_autograder do), and run again")
    return None


def sandbox_uid(isolated: bool = True) -> int | None:
    """The first of the unprivileged users this process's sandboxes run as when it is root (else
    None); the others differ from it only by their number, so they read what it reads.

    Under bwrap that user reads Python through bwrap's own folders, whatever the folders above
    the installation allow. Without bwrap it reads the real folders: raises SandboxUnusable when
    it could not import Python's own modules from them."""
    if os.geteuid() != 0:
        return None
    uid = SANDBOX_UID_BASE + os.getpid() % SANDBOX_BLOCKS * SANDBOX_UIDS
    if isolated:
        return uid
    missing = unreadable_for(uid)
    if missing:
        raise SandboxUnusable(
            "Running as root, learner code runs as an unprivileged user, who cannot read "
            f"{', '.join(missing)}. Install bubblewrap (`{bwrap.INSTALL}`), or make Python's installation "
            "readable by all users (for example `chmod o+x` on the folders above it, or a virtual "
            "environment outside /root), and run again.")
    return uid


def containment(container: bool = False) -> tuple[str, str | None]:
    """("bwrap", None) where bubblewrap can make sandboxes here, else (mode, why not): "container"
    when told that this is a throwaway grading container (`kata grade --container`; see
    ``container_problem`` for when it may be), else "process"."""
    problem = bwrap.problem()
    if problem is None:
        return "bwrap", None
    return ("container" if container else "process"), problem


def fallback_note() -> str | None:
    """The one line that says a self-study check runs without bubblewrap, and why (else None)."""
    mode, why = containment()
    if mode == "bwrap":
        return None
    note = f"{why}; learner code runs in a separate process only, without bubblewrap's sandbox."
    try:
        sandbox_uid(isolated=False)
    except SandboxUnusable:
        note += " Running as root, it runs as root: no other user could read Python's installation."
    return note


class Zygote:
    """The warm parent of this process's sandbox workers (see ``worker.zygote``).

    ``isolated``: run it under bwrap (True), without (False), or under bwrap where it can be had
    (None); ``note`` then says, in one line, why it could not (see ``fallback_note``). Without
    bwrap, ``container``: the grading container is the boundary (see ``container_problem``),
    learner code must run as an unprivileged user; otherwise it runs as root where that user
    cannot read Python. ``containment`` names the mode, as results do: "bwrap", "container" or
    "process". ``warm``: the zygote also loads what every sandbox would otherwise load for itself
    (for many sandboxes).

    Requests and replies alternate on one socket: a fork's reply (the child's pid) is read when
    first needed, so the zygote's ``import torch`` overlaps the caller's own imports. A zygote that
    died is started again on the next fork."""

    def __init__(self, frameworks=("numpy", "torch"), *, isolated: bool | None = True, container: bool = False,
                 cuda: bool = False, warm: bool = False):
        self.frameworks = ",".join(sorted(set(frameworks) | {"numpy"}))
        self.note = None
        if isolated is None:   # self-study: bwrap where it can be had, else a note and the fallback
            self.note = fallback_note()
            isolated = self.note is None
        self.isolated, self.cuda, self.warm = isolated, cuda, warm
        self.containment = "bwrap" if isolated else "container" if container else "process"
        try:
            self.uid = sandbox_uid(isolated)
        except SandboxUnusable:
            if self.containment == "container":
                raise
            self.uid = None   # root: self-study's fallback (its note says so) or --no-sandbox, as asked
        if self.containment == "container" and self.uid is None:
            raise SandboxUnusable(container_problem())
        # Every worker loads the seccomp filter; bwrap and container containment need it (see
        # bwrap.problem and container_problem), a self-study run in a plain process goes without
        # where libseccomp is missing.
        try:
            self.seccomp = bool(seccomp.request())
        except seccomp.Unavailable:
            if self.containment != "process":
                raise
            self.seccomp = False
        # In a grading container, Landlock lets a worker read only what bwrap would show, where
        # the kernel offers it (a copy of the kit outside its installed files is then out of reach).
        self.landlock = self.containment == "container" and wire.landlock_abi() > 0
        self.users = 0   # sandbox users handed out (as root, see ``user``)
        self.lock = threading.RLock()
        self.proc = None
        self.pending = None   # the ForkedProcess whose pid reply is not read yet

    def _start(self):
        self.home = tempfile.mkdtemp(prefix="kata-zygote-")
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        filter_fd = bwrap.seccomp_fd() if self.isolated else None
        if self.isolated:
            command = bwrap.command(self.frameworks.split(","), cuda=self.cuda, warm=self.warm, seccomp_fd=filter_fd)
        else:
            command = [sys.executable, "-I", str(WORKER), self.frameworks, *(["warm"] if self.warm else [])]
        try:
            with open(Path(self.home) / "stderr", "wb") as err:
                self.proc = subprocess.Popen(command, cwd=self.home, env=scrubbed_env(self.home), stdin=theirs,
                                             stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                             pass_fds=() if filter_fd is None else (filter_fd,))
        finally:
            theirs.close()
            if filter_fd is not None:
                os.close(filter_fd)

    def user(self) -> int | None:
        """The user the next sandbox runs as: as root, one no other sandbox of this process had."""
        if self.uid is None:
            return None
        self.users += 1
        return self.uid + self.users % SANDBOX_UIDS

    def close(self):
        if self.proc is not None:
            self.sock.close()        # EOF: the zygote kills its children and exits
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            shutil.rmtree(self.home, ignore_errors=True)
            self.proc = self.pending = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def fork(self, *, directory: str, file_name: str, source: bytes, framework: str, memory_mb: int,
             uid: int | None, spawn: bool, fds: list[int], stderr_fd: int):
        with self.lock:
            self._fork(directory, file_name, source, framework, memory_mb, uid, seccomp_args=(spawn,), fds=[fds])
            self.pending = ForkedProcess(self, stderr_fd)
            return self.pending

    def fork_ranks(self, *, directory: str, file_name: str, source: bytes, framework: str,
                   memory_mb: int, uid: int | None, fds: list[list[int]], stderr_fds: list[int]) -> list:
        """Fork the workers of a rank group (see RankGroup), one per item of ``fds``, at once: under
        bwrap they share namespaces of their own. Returns their ForkedProcesses."""
        with self.lock:
            self._fork(directory, file_name, source, framework, memory_mb, uid, seccomp_args=(True, True),
                       fds=fds, ranks=len(fds))
            reply, pidfds = self.reply(STARTUP_TIMEOUT_S, fds=len(fds))
            procs = []
            for zpid, pidfd, stderr_fd in zip(reply["pids"], pidfds, stderr_fds, strict=True):
                proc = ForkedProcess(self, stderr_fd)
                proc.zpid, proc.pidfd, proc._pid = zpid, pidfd, _pidfd_pid(pidfd)
                procs.append(proc)
            return procs

    def _fork(self, directory, file_name, source, framework, memory_mb, uid, *, seccomp_args, fds, ranks=None):
        if self.proc is not None and self.proc.poll() is not None:
            self.close()
        if self.proc is None:
            self._start()
        self._settle()
        # The learner's file travels as a file descriptor: an isolated worker has no path to it.
        source_fd = os.memfd_create("learner-file")
        try:
            os.write(source_fd, source)
            os.lseek(source_fd, 0, os.SEEK_SET)
            if self.isolated:
                directory = "/tmp"
            request = {"op": "fork", "dir": directory, "file": file_name, "framework": framework,
                       "memory_mb": memory_mb, "env": scrubbed_env(directory), "uid": uid,
                       "seccomp": seccomp.request(*seccomp_args, container=self.containment == "container")
                       if self.seccomp else None}
            if self.containment == "container" and self.landlock:
                request["readable"] = [*bwrap.readable_paths(), directory]
            if ranks:
                request["ranks"] = ranks
            # Each worker gets its pipes and a descriptor of the file (the same one for every rank).
            socket.send_fds(self.sock, [json.dumps(request).encode()], [fd for own in fds for fd in [*own, source_fd]])
        finally:
            os.close(source_fd)

    def _settle(self):
        if self.pending is not None:
            self.pending.pid   # reads the reply that is owed first

    def ask(self, request: dict, timeout_s: float) -> dict:
        with self.lock:   # a rank group's workers may be stopped from several threads
            self._settle()
            self.sock.send(json.dumps(request).encode())
            return self.reply(timeout_s)[0]

    def reply(self, timeout_s: float, fds: int = 1) -> tuple[dict, list[int]]:
        readable, _, _ = select.select([self.sock], [], [], timeout_s)
        message, fds = socket.recv_fds(self.sock, 1 << 16, fds)[:2] if readable else (b"", [])
        if not message:
            err = (Path(self.home) / "stderr").read_bytes().decode("utf-8", "replace").strip().splitlines()
            self.proc.kill()
            raise SandboxError("crash", "the sandbox could not be started"
                               + (f": {err[-1]}" if err else f" within {timeout_s:g} s."))
        reply = json.loads(message)
        if "error" in reply:
            raise SandboxError("crash", reply["error"])
        return reply, fds


class ForkedProcess:
    """A worker forked by a Zygote, with the parts of Popen's interface the Sandbox uses.

    The zygote names the worker with a pidfd: ``pid`` is its pid here (the zygote's own pid
    namespace may differ), ``zpid`` the zygote's."""

    def __init__(self, zygote: Zygote, stderr_fd: int):
        self.zygote = zygote
        self.stderr = os.fdopen(stderr_fd, "rb", buffering=0)
        self._pid = self.zpid = self.pidfd = self.code = None   # code: once the zygote has reaped it

    @property
    def pid(self) -> int:
        if self._pid is None:
            with self.zygote.lock:
                self.zygote.pending = None
                reply, fds = self.zygote.reply(STARTUP_TIMEOUT_S)
            self.zpid, self.pidfd = reply["pid"], fds[0]
            self._pid = _pidfd_pid(self.pidfd)
        return self._pid

    def poll_pid(self) -> int | None:
        """The pid if the zygote has answered, without waiting for it."""
        if self._pid is None and select.select([self.zygote.sock], [], [], 0)[0]:
            return self.pid
        return self._pid

    def kill(self):
        """SIGKILL to the worker's process group (as the first process of its own pid namespace,
        its death also ends every process it started)."""
        if self.code is not None:   # reaped already: its pid may name another process by now
            return
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self, timeout_s: float = 10.0) -> int | None:
        """The exit code (negative: the signal), or None if still running after ``timeout_s``."""
        if self.code is None:
            self.pid   # the fork's reply, with the zygote's pid, is read first
            self.code = self.zygote.ask({"op": "wait", "pid": self.zpid, "timeout_s": timeout_s}, timeout_s + 5)["code"]
        return self.code

    def close(self):
        self.stderr.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def tree(self) -> list[int]:
        """The worker and every process it started that is still alive (orphans included: in its
        own pid namespace they are re-parented to it)."""
        pids, todo = [], [self.pid]
        while todo and len(pids) < 4096:
            pid = todo.pop()
            pids.append(pid)
            try:
                for task in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{task}/children") as f:
                        todo.extend(int(c) for c in f.read().split())
            except (OSError, ValueError):
                pass
        return pids


class CpuMeter:
    """The CPU time a worker's process tree spent since the first sample, from the kernel's own
    accounting in /proc/<pid>/stat, which the learner's code cannot write: each process's own time
    (utime + stime: its threads', ended ones too) and that of the children it waited for (cutime +
    cstime).

    A child that ends between two samples is counted all the same: waiting for it adds its whole
    time to its parent's, less what was counted of it while it ran (``owed``), so nothing counts
    twice. Only a child that the kernel reaps without a wait (its parent ignores SIGCHLD) takes its
    time along: what was seen of it stays counted, the rest is left to the wall-clock backstop. The
    measure never exceeds the CPU time spent."""

    TICK_S = 1 / os.sysconf("SC_CLK_TCK")

    def __init__(self, stats: dict):
        self.last = stats   # (pid, start time) -> (own, waited-for children's) ticks, at the last sample
        self.ticks = 0
        self.owed = 0       # ticks counted of processes that ended, not yet seen in a parent's

    def add(self, stats: dict):
        own = waited = 0
        for key, (mine, children) in stats.items():
            before = self.last.get(key, (0, 0))
            own += mine - before[0]
            waited += children - before[1]
        self.owed += sum(mine + children for key, (mine, children) in self.last.items() if key not in stats)
        settled = min(self.owed, waited)
        self.owed -= settled
        self.ticks += own + waited - settled
        self.last = stats

    @property
    def seconds(self) -> float:
        return self.ticks * self.TICK_S


class Budget:
    """The time limits of one request, judged from outside the worker.

    The learner is charged the CPU time that the worker's process tree spends from the request's
    start (``CpuMeter``): a loaded machine stretches wall time, not CPU time, so it costs no
    points. A wall-clock backstop WALL_BACKSTOP times larger stops code that waits instead of
    computing (a sleep, a blocked read), which spends no CPU time. Five times: a correct call still
    finishes on a fifth of a core (five busy processes per core, more than `kata grade -j` starts),
    and code that sleeps costs five limits of wall time a call (50 s at the usual 10 s), for
    MAX_TIMEOUTS calls. ``stats`` None (the sandbox's start, which runs none of the learner's
    code): ``cpu_s`` on the wall clock only."""

    def __init__(self, cpu_s: float, stats: dict | None, spent: "Spent | None" = None):
        self.meter = None if stats is None else CpuMeter(stats)
        self.cpu_s = cpu_s
        self.wall_s = cpu_s if stats is None else cpu_s * WALL_BACKSTOP
        # What the grading has left, when that is less: the request then stops where the grading's
        # budget ends, and says so.
        self.spent, self.cpu_left, self.wall_left = spent, *(spent.left() if spent else (None, None))
        self.capped = spent is not None and (self.cpu_left < self.cpu_s or self.wall_left < self.wall_s)
        if self.capped:
            self.cpu_s, self.wall_s = min(self.cpu_s, self.cpu_left), min(self.wall_s, self.wall_left)
        self.started = self.sampled = time.monotonic()

    def left(self) -> float:
        """Seconds until the next look at the worker: the next sample, or the wall-clock limit."""
        return max(0.0, min(self.started + self.wall_s, self.sampled + SAMPLE_S) - time.monotonic())

    def charge(self):
        """Add what this request spent to its grading's total (``spent``, given with ``stats``)."""
        self.spent.add(self.meter.seconds, time.monotonic() - self.started)


class Spent:
    """What the requests of one grading spent together (a file's sandbox, its siblings and the ranks
    of its groups share one): CPU time of the worker's tree and wall-clock time, against the
    grading's budget (``cpu_s``; its wall-clock budget GRADING_WALL times that). Each request's
    limits are those of its call or what the grading has left, the smaller; once either is spent,
    no request of the grading runs, so a file that waits (45 s a call, under each call's backstop)
    or computes for long holds its grading slot for its budget at most, and the checks done keep
    their verdicts."""

    def __init__(self, cpu_s: float):
        self.cpu_s, self.wall_s = cpu_s, cpu_s * GRADING_WALL
        self.cpu = self.wall = 0.0
        self.exhausted = False         # a request was stopped where the budget ended
        self.lock = threading.Lock()   # the ranks of a group are asked from threads of their own

    def add(self, cpu: float, wall: float):
        with self.lock:
            self.cpu += cpu
            self.wall += wall

    def left(self) -> tuple[float, float]:
        with self.lock:
            return max(0.0, self.cpu_s - self.cpu), max(0.0, self.wall_s - self.wall)

    def over(self) -> bool:
        return self.exhausted or 0.0 in self.left()


class Sandbox:
    def __init__(self, source: Path, *, zygote: Zygote, framework: str, module_name: str, timeout_s: float,
                 import_timeout_s: float, memory_mb: int, data_limit: bool = True, spawn: bool = True,
                 allow: tuple[str, ...] = (), budget_s: float | None = None):
        self.zygote = zygote
        # The grading's CPU-time budget for all its requests (see Spent); None: each call's own limits only.
        self.spent = None if budget_s is None else Spent(budget_s)
        self.source_text = Path(source).read_bytes()   # the file as handed in: what scans read
        self.appended = b""   # trusted code the worker loads after it (see ``sibling``)
        self.file_name = Path(source).name
        self.framework = framework
        self.allow = allow            # what the static check lets through for the kata (structure.tampering)
        self.module_name = module_name
        self.timeout_s = timeout_s
        self.import_timeout_s = import_timeout_s
        self.memory_mb = memory_mb
        # The kernel's data-size limit makes a hog fail with MemoryError; it is not applied where
        # a CUDA context may be created (untested with CUDA's host reservations). The RSS watch
        # in _wait caps memory either way.
        self.data_limit = data_limit
        self.spawn = spawn   # False: the worker is killed if it starts a thread, as for a process (see seccomp.py)
        self.owns_zygote = False   # a compiled copy's zygote is its own, closed with it (see ``compiled``)
        self._unstarted()

    # --- lifecycle ---------------------------------------------------------------------------

    def _unstarted(self):
        """The state of a sandbox whose worker has not started: what a new sandbox, a sibling and
        a rank of a group begin with."""
        self.proc = None
        self.loaded = None          # the load reply, once loaded
        self.load_error = None      # a LoadError, once loading failed: never retried
        self.stderr_tail = b""
        self.timeouts = 0
        self.groups = {}            # world size (or ("kit", world)) -> a RankGroup (see ``rank_group``)

    def start(self):
        """Fork the worker; it may still be waiting for the zygote's imports when this returns."""
        # An isolated worker writes the file into its own private /tmp; otherwise it gets an
        # empty folder of its own here (owned by the sandbox user, as root).
        self.uid = self.zygote.user()
        self.tmp = None if self.zygote.isolated else tempfile.mkdtemp(prefix="kata-sandbox-")
        if self.tmp is not None and self.uid is not None:
            os.chown(self.tmp, self.uid, self.uid)
        theirs, err_r = self.pipes()
        proc = self.zygote.fork(directory=self.tmp, file_name=self.file_name,
                                source=self.source_text + self.appended,
                                framework=self.framework,
                                memory_mb=self.memory_mb if self.data_limit else 0, uid=self.uid,
                                spawn=self.spawn, fds=theirs, stderr_fd=err_r)
        for fd in theirs:
            os.close(fd)
        self.started(proc, self.uid)
        return self

    def pipes(self) -> tuple[list[int], int]:
        """New pipes to this sandbox's worker: the worker's ends (to pass on), and stderr's read end."""
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        err_r, err_w = os.pipe()
        os.set_blocking(self.req_w, False)
        return [req_r, resp_w, err_w], err_r

    def started(self, proc, uid):
        """The worker ``proc``, forked as ``uid``, is this sandbox's: not yet ready, nothing loaded."""
        self.proc, self.uid = proc, uid
        self.stderr_open, self.ready, self.loaded = True, False, None

    def sibling(self, appended: bytes) -> "Sandbox":
        """A new sandbox (not started) under the same zygote and limits whose worker loads this
        file with ``appended`` after it: the kit's given code for a file that lacks it."""
        other = copy.copy(self)
        other.appended = self.appended + appended
        other._unstarted()
        return other

    def compiled(self) -> "Sandbox":
        """A new sandbox (not started) of this file, with the same limits, under a zygote of its own
        whose Triton compiles kernels for the GPU instead of interpreting them (Triton makes
        triton.language's own functions for one or the other as it is imported): a Triton kata's
        @cuda checks. Its zygote closes with it."""
        other = copy.copy(self)
        other.zygote = Zygote([COMPILED], isolated=self.zygote.isolated,
                              container=self.zygote.containment == "container", cuda=True)
        other.framework, other.spawn, other.data_limit = COMPILED, True, False   # ptxas runs; CUDA's reservations
        other.owns_zygote = True
        other._unstarted()
        return other

    def rank_group(self, world: int) -> "RankGroup":
        """This file's group of ``world`` ranks (see RankGroup): one per world size for the whole
        grading, since starting one costs more than a check's calls; closed with this sandbox."""
        if world not in self.groups:
            self.groups[world] = RankGroup(self, world)
        return self.groups[world]

    def kit_group(self, world: int) -> "RankGroup":
        """A group of ``world`` ranks under the same zygote and limits whose file is empty: kit code
        alone runs there, so what it measures (the bytes one all-reduce sends) no code of the
        learner's can shape, as it can in its own ranks' processes. Closed with this sandbox."""
        if ("kit", world) not in self.groups:
            kit = copy.copy(self)
            kit.source_text, kit.appended = b"", b""
            kit.spent = None   # kit code: never charged to the learner's grading budget
            kit._unstarted()
            self.groups["kit", world] = RankGroup(kit, world)
        return self.groups["kit", world]

    def close(self):
        for group in self.groups.values():
            group.close()
        if self.proc is not None:
            self._kill()
            for fd in (self.req_w, self.resp_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.proc.close()
            self.proc = None
            if self.tmp is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)
        if self.owns_zygote:
            self.zygote.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _kill(self) -> int | None:
        """Kill the worker and what it started; returns its exit code if the zygote could say."""
        try:
            self.proc.kill()
            return self.proc.wait()
        except SandboxError:   # the zygote is gone, and its children with it
            return None

    def restart(self):
        self.close()
        self.start()

    # --- loading -----------------------------------------------------------------------------

    def ensure_loaded(self) -> dict:
        """Load the learner's file (once); raises LoadError with a sentence a learner understands."""
        if self.load_error is not None:
            raise self.load_error
        if self.loaded is not None and self.proc is not None:
            return self.loaded
        if self.proc is None:
            self.start()
        try:
            if not self.ready:
                self._exchange(None, STARTUP_TIMEOUT_S, "starting the sandbox", cpu=False)
                self.ready = True
            reply, _ = self._exchange(({"op": "load", "path": self.file_name, "name": self.module_name}, []),
                                      self.import_timeout_s, f"importing {self.file_name}")
        except SandboxError as exc:
            self.load_error = LoadError(_load_message(exc, self.file_name))
            self.close()
            raise self.load_error from None
        if not reply.get("ok"):
            self.load_error = LoadError(describe_error(reply.get("error"), f"importing {self.file_name}"),
                                        reply.get("error"))
            self.close()
            raise self.load_error
        self.loaded = reply
        return reply

    # --- requests ----------------------------------------------------------------------------

    def request(self, header: dict, blobs: list, timeout_s: float | None = None, what: str = "the call"):
        """Send one request; returns (reply, blobs). After a SandboxError the worker is restarted.

        After MAX_TIMEOUTS timed-out requests the rest are refused at once, so an endless loop
        costs the learner seconds, not a timeout for every check."""
        if self.timeouts >= MAX_TIMEOUTS:
            raise SandboxError("timeout", f"{what} was not run: {self.timeouts} earlier calls timed out "
                               "(an endless loop?), so the remaining checks are not run. Fix that first.")
        self.ensure_loaded()
        try:
            return self._exchange((header, blobs), timeout_s or self.timeout_s, what)
        except SandboxError as exc:
            self.timeouts += exc.kind == "timeout"
            self.restart()
            raise

    def _exchange(self, message, timeout_s: float, what: str, cpu: bool = True):
        """Send ``message`` (None: none) and read the reply within ``timeout_s`` of CPU time and
        the wall-clock backstop, or what the grading has left (``cpu`` False: ``timeout_s`` on the
        wall clock only, uncharged: the sandbox's start runs none of the learner's code)."""
        if cpu and self.spent is not None and self.spent.over():
            raise SandboxError("timeout", f"{what} was not run: {self.spent_sentence()}, so the remaining checks are "
                               "not run. Make the slow or waiting calls quicker first.")
        if cpu:
            self.proc.pid   # the tree's CPU time is counted from here, so its root must be known
        budget = Budget(timeout_s, self._sample(memory=False)[1] if cpu else None, self.spent if cpu else None)
        try:
            if message is not None:
                self._send(*message, budget=budget, what=what)
            header, blobs = wire.read_frame(self.resp_r, wait=lambda: self._wait(budget, what))
        except EOFError:
            raise self._died(what) from None
        except (ValueError, UnicodeDecodeError) as exc:
            self._kill()
            raise SandboxError("protocol", f"the sandbox sent a malformed reply during {what} ({exc}).") from None
        finally:
            if budget.spent is not None:
                if self.proc is not None:
                    budget.meter.add(self._sample(memory=False)[1])   # what it spent since the last look
                budget.charge()
        header = encodable(header)   # the learner's text, which results, feedback and history write as UTF-8
        if "ok" not in header and header.get("op") != "ready":
            self._kill()
            raise SandboxError("protocol", f"the sandbox sent a malformed reply during {what}.")
        return header, blobs

    def _send(self, header, blobs, *, budget, what):
        view = memoryview(wire.encode_frame(header, blobs))
        while view:
            self._check(budget, what)
            _, writable, _ = select.select([], [self.req_w], [], budget.left())
            if writable:
                try:
                    view = view[os.write(self.req_w, view):]
                except BrokenPipeError:
                    raise self._died(what) from None

    def _wait(self, budget, what):
        while True:
            self._check(budget, what)
            watched = [self.resp_r] + ([self.proc.stderr] if self.stderr_open else [])
            readable, _, _ = select.select(watched, [], [], budget.left())
            if self.proc.stderr in readable:
                chunk = os.read(self.proc.stderr.fileno(), 1 << 16)
                self.stderr_open = bool(chunk)   # closed by the learner's code: stop watching it
                self.stderr_tail = (self.stderr_tail + chunk)[-4096:]
            if self.resp_r in readable:
                return

    def _check(self, budget: Budget, what: str):
        """Stop the worker if the request is past a limit: the wall clock's, or (looked at every
        SAMPLE_S) its tree's memory or CPU time."""
        now = time.monotonic()
        late = now - budget.started >= budget.wall_s
        if not late and now - budget.sampled < SAMPLE_S:
            return
        budget.sampled = now
        rss_mb, stats = self._sample()
        if rss_mb > self.memory_mb:
            self._kill()
            raise SandboxError("memory", f"{what} used more than the sandbox's {self.memory_mb} MB "
                               "of memory, so the sandbox was stopped.")
        if budget.meter is not None:
            budget.meter.add(stats)
            if budget.meter.seconds > budget.cpu_s:
                self._kill()
                if budget.capped and budget.cpu_s == budget.cpu_left:
                    self.spent.exhausted = True
                    raise TimedOut("budget", f"{what} was stopped when {self.spent_sentence()}")
                raise TimedOut("cpu", f"{what} did not finish within {budget.cpu_s:g} s of CPU time")
        if late:
            self._kill()
            if budget.meter is None:
                raise SandboxError("timeout", f"{what} did not finish within {budget.wall_s:g} s.")
            if budget.capped and budget.wall_s == budget.wall_left:
                self.spent.exhausted = True
                raise TimedOut("budget", f"{what} was stopped when {self.spent_sentence()}")
            raise TimedOut("wall", f"{what} was stopped after {budget.wall_s:g} s of wall-clock time, having "
                           f"used {budget.meter.seconds:.1f} s of its {budget.cpu_s:g} s of CPU time")

    def spent_sentence(self) -> str:
        return (f"this file's grading had used its budget ({self.spent.cpu_s:g} s of CPU time, "
                f"{self.spent.wall_s:g} s of wall-clock time, for all its calls together)")

    def _sample(self, memory: bool = True) -> tuple[float, dict]:
        """One look at the worker's process tree from outside: the memory it holds in MB (0 if not
        ``memory``; see ``_held_bytes``), and each process's CPU ticks (own, waited-for
        children's) by (pid, start time), for a CpuMeter."""
        if self.proc.poll_pid() is None:
            return 0.0, {}
        tree, ticks = self.proc.tree(), {}
        for pid in tree:
            try:
                stat = _read_proc(f"/proc/{pid}/stat")
                # The fields after the command name, which the learner's code chooses (")" included).
                fields = stat[stat.rindex(b")") + 2:].split()
                ticks[pid, fields[19]] = (int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14]))
            except (OSError, IndexError, ValueError):
                pass
        return (_held_bytes(tree, self.zygote.isolated) / 2**20 if memory else 0.0), ticks

    def memory(self, held: bool = False) -> dict[str, int]:
        """The worker's memory as the kernel counts it, in bytes (read from here, outside it): its
        "peak" resident memory (since ``reset_peak``) and, if ``held``, the memory it "held" now:
        its own pages, anonymous and shared (``share_memory_()``, a shared mapping), no library's
        code or file's cache; the files of its private tmpfs (see ``_held_bytes``) and the bytes
        waiting in its pipes (the process tree is walked for these only when asked). A shared page
        mapped from a tmpfs file counts twice: memory is never missed."""
        fields = {"VmHWM:": "peak", "RssAnon:": "anonymous", "RssShmem:": "shared"}
        found = {}
        for line in _read_proc(f"/proc/{self.proc.pid}/status", 1 << 13).splitlines():
            name, *value = line.decode().split()
            if name in fields:
                found[fields[name]] = int(value[0]) << 10   # kB
        own = found.pop("anonymous") + found.pop("shared")
        if held:
            found["held"] = own + _outside_processes(self.proc.tree(), self.zygote.isolated)
        return found

    def reset_peak(self):
        """Make the worker's peak resident memory its current one (its /proc's clear_refs; inside
        the sandbox the worker cannot write it, see ``worker._private_mounts``)."""
        fd = os.open(f"/proc/{self.proc.pid}/clear_refs", os.O_WRONLY)
        try:
            os.write(fd, b"5")
        finally:
            os.close(fd)

    def _died(self, what):
        # Its reply channel closed: it exited, or closed the channel and must be stopped.
        code = self.proc.wait(timeout_s=1.0)
        if code is None:
            code = self._kill()
        if code == -signal.SIGSYS:   # the only system calls the filter kills for (see seccomp.py)
            if self.spawn:
                return SandboxError("crash", f"your code started a process during {what}, which the sandbox does not "
                                    "allow (no kata needs one, and the memory and time of another process could "
                                    "not be capped exactly), so the sandbox was stopped.", forbidden=True)
            return SandboxError("crash", f"your code started a thread or a process during {what}, which a torch "
                                "kata's sandbox does not allow (the graders see only the work of your own thread), "
                                "so the sandbox was stopped.", forbidden=True)
        tail = self.stderr_tail.decode("utf-8", "replace").strip().splitlines()[-1:] if self.stderr_tail else []
        if code is None:
            how = "closed its channel to the grader"
        elif code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with status {code} (os._exit, or a crash)"
        detail = f" Last line on stderr: {tail[0]}" if tail else ""
        return SandboxError("crash", f"the sandbox process {how} during {what}.{detail}")


class RankGroup:
    """``world`` workers of one learner file, started together as the ranks of one
    torch.distributed group (gloo): under bwrap in pid, mount, network, IPC and UTS namespaces of
    their own, so that they talk to each other over a loopback that only they have (see
    ``worker._fork_isolated``). Each rank is a Sandbox (``ranks[r]``) with the learner's limits, whose
    requests a grader sends from a thread of its own (a collective waits for every rank). A rank
    that fails stops the whole group, since the others would wait for it in their next
    collective; the group starts afresh, as a whole, at the next ``start``."""

    def __init__(self, sandbox: Sandbox, world: int):
        self.sandbox, self.world = sandbox, world
        self.ranks = [RankSandbox(sandbox, self, rank) for rank in range(world)]
        self.lock = threading.Lock()
        self.tmp = self.port = None
        self.running = self.holding = False   # holding: a share of _ONE_GROUP's lock
        self.left_waiting = False   # a rank was left waiting in a collective another never called

    @property
    def store(self) -> str:
        """Where the ranks meet (torch.distributed's store): a file in their folder, or, in a
        grading container, where a rank may make no file (see seccomp.NO_NEW_FILES), a port of the
        loopback."""
        if self.sandbox.zygote.containment == "container":
            return f"tcp://127.0.0.1:{self.port}"
        return f"{'/tmp' if self.sandbox.zygote.isolated else self.tmp}/store"

    def start(self):
        """Fork every rank (closing what is left of an earlier start)."""
        self.close()
        zygote = self.sandbox.zygote
        if zygote.containment == "container":
            self.holding = _ONE_GROUP.take()
            self.port = _free_port()
        uid = zygote.user()   # one user for the group: its ranks share the store's folder
        if not zygote.isolated:
            self.tmp = tempfile.mkdtemp(prefix="kata-ranks-")
            if uid is not None:
                os.chown(self.tmp, uid, uid)
        ours = [rank.pipes() for rank in self.ranks]
        try:
            procs = zygote.fork_ranks(directory=self.tmp, file_name=self.sandbox.file_name,
                                      source=self.sandbox.source_text + self.sandbox.appended,
                                      framework=self.sandbox.framework,
                                      memory_mb=self.sandbox.memory_mb if self.sandbox.data_limit else 0,
                                      uid=uid, fds=[theirs for theirs, _ in ours], stderr_fds=[err for _, err in ours])
        except BaseException:
            for rank, (_, err) in zip(self.ranks, ours):
                for fd in (rank.req_w, rank.resp_r, err):
                    os.close(fd)
            raise
        finally:
            for theirs, _ in ours:
                for fd in theirs:
                    os.close(fd)
        for rank, proc in zip(self.ranks, procs):
            rank.started(proc, uid)
        self.running = True
        return self

    def stop(self):
        """Stop every rank (from any thread: a rank that failed stops the others)."""
        with self.lock:
            self.running = False
            for rank in self.ranks:
                if rank.proc is not None:
                    rank.proc.kill()

    def close(self):
        self.stop()
        for rank in self.ranks:
            Sandbox.close(rank)
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
        if self.holding:
            self.holding = False
            _ONE_GROUP.give_back()

    def loopback_bytes(self) -> int | None:
        """Bytes sent so far over the group's own loopback, read by the kernel's count from
        outside the ranks (/proc/PID/net/dev of a rank); None where the ranks share the machine's
        network (no bwrap), whose count others add to."""
        if not self.sandbox.zygote.isolated or not self.running:
            return None
        for line in _read_proc(f"/proc/{self.ranks[0].proc.pid}/net/dev", 1 << 14).decode().splitlines():
            name, _, counts = line.partition(":")
            if name.strip() == "lo":
                return int(counts.split()[8])   # transmitted bytes
        return None


class RankSandbox(Sandbox):
    """One rank of a RankGroup: a Sandbox whose worker the group forks, and whose failure stops
    the group (``restart``) instead of forking a lone worker."""

    def __init__(self, sandbox: Sandbox, group: RankGroup, rank: int):
        self.__dict__.update(vars(sandbox))
        self.group, self.rank = group, rank
        self.spawn = True   # gloo's own threads
        self.tmp = None     # the ranks write in their group's folder, which the group removes
        self._unstarted()

    def start(self):
        self._running()
        return self

    def request(self, header: dict, blobs: list, timeout_s: float | None = None, what: str = "the call"):
        self._running()
        return super().request(header, blobs, timeout_s, what)

    def _running(self):
        if not self.group.running:
            raise SandboxError("crash", f"rank {self.rank} was stopped because another rank failed first.")

    def restart(self):
        self.group.stop()

    def close(self):
        self.group.close()


class _OneGrading:
    """In a grading container every rank group shares the container's network: a group's gloo and
    store sockets could be reached by another's ranks (which may make sockets; no other worker
    may). The grading processes of a class run share one lock (``one_rank_group_at_a_time``) and
    start a group only while they hold it, so no two gradings' groups ever run at once there. A
    process grades one file at a time: the groups of that grading (one per world size, the kit's
    own) share its hold."""

    def __init__(self):
        self.lock, self.groups = None, 0

    def take(self) -> bool:
        """Hold the lock for one more group of this process (waiting for it if this is the first);
        False where there is no lock to hold."""
        if self.lock is None:
            return False
        if self.groups == 0:
            self.lock.acquire()
        self.groups += 1
        return True

    def give_back(self):
        self.groups -= 1
        if self.groups == 0:
            self.lock.release()


_ONE_GROUP = _OneGrading()


def one_rank_group_at_a_time(lock):
    """Share ``lock`` (a multiprocessing lock, one per class run; None: none) among this process's
    rank groups in a grading container (see _OneGrading)."""
    _ONE_GROUP.lock, _ONE_GROUP.groups = lock, 0


def _free_port() -> int:
    """A TCP port of the loopback that no one listens on now, for a rank group's store."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _pidfd_pid(pidfd: int) -> int:
    """The pid, in this process's pid namespace, of the process a pidfd names."""
    with open(f"/proc/self/fdinfo/{pidfd}") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Pid:"))


def _held_bytes(tree: list[int], isolated: bool) -> int:
    """The memory a worker's process tree holds, read from the kernel by this process: each
    process's resident pages (a child holds memory too) and what ``_outside_processes`` counts.
    Sockets, memfds and SysV shared memory, whose memory no one could see from here, are refused by
    the seccomp filter."""
    held = 0
    for pid in tree:
        try:
            held += int(_read_proc(f"/proc/{pid}/statm").split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            continue
    return held + _outside_processes(tree, isolated)


def _outside_processes(tree: list[int], isolated: bool) -> int:
    """Memory a worker's process tree holds that no process's pages show: what its pipes hold (a
    pipe, opened again through /proc, says how many bytes wait in it) and, isolated, the files in
    its private /tmp and /dev/shm (tmpfs: memory too)."""
    held, pipes = 0, set()
    for pid in tree:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            path = f"/proc/{pid}/fd/{fd}"
            try:
                target = os.readlink(path)
                if not target.startswith("pipe:") or target in pipes:
                    continue
                pipes.add(target)
                pipe = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                held += struct.unpack("i", fcntl.ioctl(pipe, termios.FIONREAD, b"\0" * 4))[0]
            except OSError:
                pass
            finally:
                os.close(pipe)
    if isolated and tree:
        for folder in ("tmp", "dev/shm"):
            try:
                fs = os.statvfs(f"/proc/{tree[0]}/root/{folder}")
            except OSError:
                continue
            held += (fs.f_blocks - fs.f_bfree) * fs.f_frsize
    return held


def _read_proc(path: str, size: int = 4096) -> bytes:
    """A small /proc file, whole (one read, without a Python file object: sampled every request)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def _load_message(exc: SandboxError, file_name: str) -> str:
    if isinstance(exc, TimedOut) and exc.clock == "budget":
        return str(exc)
    if isinstance(exc, TimedOut):
        return exc.finding + ": code at the top level of the file runs at import, " + (
            "so move long work into functions." if exc.clock == "cpu" else
            "and must not wait (time.sleep, a blocked read or lock).")
    if exc.kind == "crash":
        return f"importing {file_name} ended the process: {exc}"
    return str(exc)


def describe_error(error: dict | None, what: str) -> str:
    """A learner's exception, as one sentence and the lines of their file it went through."""
    if not isinstance(error, dict):
        return f"{what} failed, and the sandbox could not say why."
    kind, message = str(error.get("type", "Exception")), str(error.get("message", ""))
    if error.get("exit"):
        text = f"{what} called sys.exit({message}); a graded file must not exit."
    elif kind == "SyntaxError":
        text = f"{what} failed: SyntaxError: {message}"
    else:
        text = f"{what} raised {kind}: {message}" if message else f"{what} raised {kind}"
    lines = []
    for frame in error.get("where", []) or []:
        if isinstance(frame, dict):
            lines.append(f"  line {frame.get('line')}, in {frame.get('function')}: {frame.get('text')}")
    return "\n".join([text, *lines])
