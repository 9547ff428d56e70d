"""The seccomp filters every sandbox runs under, built with libseccomp (through pyseccomp).

Modelled on Docker's default profile: the system calls it refuses to a container without
CAP_SYS_ADMIN are refused here too (EPERM), among them the kernel keyrings (keyctl, add_key,
request_key: not namespaced, so a sandbox could read the grader's keys or leave a classmate's
source for another sandbox), new namespaces (unshare, setns, clone with a CLONE_NEW* flag), mounts,
ptrace, bpf, perf_event_open and userfaultfd. clone3 fails with ENOSYS, as in Docker's profile, so
that glibc falls back to clone, whose flags a filter can read. Beyond Docker's list, a worker may
not hold memory where its cap cannot see it: memfd_create, SysV shared memory and sockets (whose
buffers are kernel memory) are refused; a kata needs none of them, and the worker talks to the
grader over pipes. For the same reason a worker may not start a process: the memory and CPU
time of its process tree are capped by looking at it every few milliseconds, so a child that
fills its memory while its parent waits could be seen in one run and not in the next, and the
same file would not always get the same grade. Threads share their process's data limit, which
the kernel enforces on every allocation. A worker that starts a process (fork, vfork, or clone
without CLONE_THREAD: posix_spawn and subprocess too) is killed (SIGSYS), and the grader says so.

Two filters, because filters stack and each can only add refusals: ``zygote`` (bubblewrap's
``--seccomp``) leaves the zygote what it needs to make each worker's namespaces and mounts and to
give it a session keyring of its own; ``worker`` (loaded by each worker before it runs learner
code, see ``worker.load_seccomp``) refuses those too, and kills a worker that starts a process. A
worker that may not ``spawn`` (a torch kata's, on the CPU) is also killed when it starts a
thread: the torch calls a structure check records are those of the learner's own thread, so work
done in another would go unseen. No kata needs one, and torch's own thread pools stay unused with
one thread.

Ranks (tp-attention's workers, started together by the grader: see ``sandbox.RankGroup``) talk to
each other through torch.distributed's gloo backend, which needs TCP sockets and threads of its
own. Their filter lets them make AF_INET sockets (and NETLINK_ROUTE ones, through which gloo
reads the interfaces' addresses), and only those, in a network namespace of the group's own that
holds nothing but its loopback (see ``worker._fork_isolated``): no rank reaches another sandbox or
the network, and with no capability left none can change that network. The kernel memory of those
sockets is bounded by their count (RLIMIT_NOFILE) and the kernel's buffer limits. The zygote,
which brings that loopback up, may make sockets: every worker's own filter refuses them again (the
zygote's filter is also kept small, as it passes through a file that RLIMIT_FSIZE caps). Without bwrap (a grading container) the
ranks share the container's network, which the container bounds.
"""
from __future__ import annotations

import errno
import functools
import tempfile

# Docker's default profile refuses these (moby/profiles/seccomp/default.json: neither allowed
# nor allowed with an argument test), less what is gone from x86_64 or named below.
DOCKER_REFUSED = (
    "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "create_module", "delete_module",
    "finit_module", "fsconfig", "fsmount", "fsopen", "fspick", "get_kernel_syms", "get_mempolicy", "init_module",
    "io_uring_enter", "io_uring_register", "io_uring_setup", "ioperm", "iopl", "kcmp", "kexec_file_load",
    "kexec_load", "lookup_dcookie", "mbind", "mount_setattr", "move_mount", "move_pages", "name_to_handle_at",
    "nfsservctl", "open_by_handle_at", "open_tree", "perf_event_open", "pidfd_getfd", "pivot_root",
    "process_vm_readv", "process_vm_writev", "ptrace", "query_module", "quotactl", "quotactl_fd", "reboot",
    "request_key", "set_mempolicy", "setns", "settimeofday", "swapoff", "swapon", "syslog", "sysfs", "umount2",
    "uselib", "userfaultfd", "ustat", "vhangup",
)
# Memory a sandbox could hold outside its processes' pages (see the module's docstring).
HIDDEN_MEMORY = ("memfd_create", "memfd_secret", "shmget", "socket", "socketpair")
AF_INET, AF_NETLINK, NETLINK_ROUTE, MAX_FAMILY = 2, 16, 0, 64
# What the zygote itself must still do for each worker: make its namespaces and mounts.
WORKER_ONLY = ("unshare", "mount")
CLONE_THREAD = 0x10000
CLONE_NEW = {"CLONE_NEWNS": 0x20000, "CLONE_NEWCGROUP": 0x2000000, "CLONE_NEWUTS": 0x4000000,
             "CLONE_NEWIPC": 0x8000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
             "CLONE_NEWNET": 0x40000000}
KEYCTL_JOIN_SESSION_KEYRING = 1
# In a grading container (no namespaces: /tmp, /dev/shm, the disk and the IPC objects are the
# container's, shared by every pair graded there), a worker makes no file, folder, link, node,
# message queue or semaphore set anywhere and changes no file's mode: a pair can neither leave
# anything for another to find (a classmate's code in /dev/shm) nor fill the disk. Its own copy of
# the learner's file is written before the filter loads, and its size is capped (RLIMIT_FSIZE).
# open and openat are refused only with O_CREAT or O_TMPFILE; openat2, whose flags lie where a
# filter cannot read them, always.
NO_NEW_FILES = ("creat", "mkdir", "mkdirat", "mknod", "mknodat", "link", "linkat", "symlink", "symlinkat", "rename",
                "renameat", "renameat2", "chmod", "fchmod", "fchmodat", "setxattr", "lsetxattr", "fsetxattr",
                "openat2", "mq_open", "msgget", "semget")
O_CREAT, O_TMPFILE = 0o100, 0o20000000


class Unavailable(Exception):
    """libseccomp (and its Python bindings) cannot be loaded here."""


def _seccomp():
    try:
        import pyseccomp
    except (ImportError, OSError) as exc:   # the bindings, or the shared library they load
        raise Unavailable(f"libseccomp could not be loaded ({exc}); install it (`apt-get install libseccomp2`)") \
            from None
    return pyseccomp


def _build(worker: bool, spawn: bool = True, ranks: bool = False, container: bool = False) -> bytes:
    s = _seccomp()
    refuse = s.ERRNO(errno.EPERM)
    f = s.SyscallFilter(s.ALLOW)
    if worker:
        for name in ("fork", "vfork"):
            f.add_rule(s.KILL_PROCESS, name)
        if spawn:   # threads only
            f.add_rule(s.KILL_PROCESS, "clone", s.Arg(0, s.MASKED_EQ, CLONE_THREAD, 0))
        else:
            f.add_rule(s.KILL_PROCESS, "clone")
    for name in DOCKER_REFUSED + HIDDEN_MEMORY + (WORKER_ONLY if worker else ()):
        if name == "socket" and not worker:
            continue   # the zygote brings a rank group's loopback up; each worker's own filter refuses sockets
        if name == "socket" and ranks:   # AF_INET sockets, in a rank group's own loopback-only network
            # Every family but AF_INET and AF_NETLINK's NETLINK_ROUTE (one comparison per rule).
            for family in range(MAX_FAMILY):
                if family not in (AF_INET, AF_NETLINK):
                    f.add_rule(refuse, name, s.Arg(0, s.EQ, family))
            f.add_rule(refuse, name, s.Arg(0, s.GE, MAX_FAMILY))
            f.add_rule(refuse, name, s.Arg(0, s.EQ, AF_NETLINK), s.Arg(2, s.NE, NETLINK_ROUTE))
        else:
            f.add_rule(refuse, name)
    f.add_rule(s.ERRNO(errno.ENOSYS), "clone3")
    for flag in CLONE_NEW.values() if spawn else ():
        f.add_rule(refuse, "clone", s.Arg(0, s.MASKED_EQ, flag, flag))
    if worker and container:
        for name in NO_NEW_FILES:
            f.add_rule(refuse, name)
        for name, flags in (("open", 1), ("openat", 2)):
            for bit in (O_CREAT, O_TMPFILE):
                f.add_rule(refuse, name, s.Arg(flags, s.MASKED_EQ, bit, bit))
    if worker:
        f.add_rule(refuse, "keyctl")
    else:   # the zygote's only keyring call: each worker joins a new, empty session keyring
        f.add_rule(refuse, "keyctl", s.Arg(0, s.NE, KEYCTL_JOIN_SESSION_KEYRING))
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


@functools.cache
def zygote() -> bytes:
    """The zygote's filter, as a classic-BPF program (bubblewrap's ``--seccomp`` reads it)."""
    return _build(worker=False)


@functools.cache
def worker(spawn: bool = True, ranks: bool = False, container: bool = False) -> bytes:
    """The worker's filter, as a classic-BPF program (``worker.load_seccomp`` loads it); ``ranks``:
    a rank's, which may also make AF_INET sockets and threads; ``container``: a worker in a grading
    container, which makes no file (see NO_NEW_FILES)."""
    return _build(worker=True, spawn=spawn or ranks, ranks=ranks, container=container)


@functools.cache
def request(spawn: bool = True, ranks: bool = False, container: bool = False) -> dict:
    """What a fork request tells the zygote: the worker's filter, and keyctl's number on this
    machine (the worker joins a session keyring of its own before the filter refuses keyctl)."""
    s = _seccomp()
    return {"filter": worker(spawn, ranks, container).hex(), "keyctl": s.resolve_syscall(s.system_arch(), "keyctl")}
