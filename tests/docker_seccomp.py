"""Run a command as Docker runs a container's processes by default, for the tests of grading in a
container: `python tests/docker_seccomp.py COMMAND [ARG...]`.

Docker's default seccomp profile refuses what a sandbox needs to make namespaces: unshare, setns,
mount, umount2 and pivot_root, and clone with any CLONE_NEW* flag, fail with EPERM, as do the kernel
keyrings (add_key, request_key, keyctl); clone3 fails with ENOSYS (so that glibc falls back to
clone, whose flags a filter can read). Its default capabilities leave root without CAP_SYS_ADMIN,
CAP_SYS_PTRACE and the rest outside DOCKER_CAPS. This installs the same refusals (a classic-BPF
filter, x86_64 only) and capability bounding set, then execs COMMAND: what it starts inherits both.
"""
import ctypes
import os
import platform
import struct
import sys

PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 24, 38, 22, 2
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
SYS = {"clone": 56, "mount": 165, "umount2": 166, "pivot_root": 155, "unshare": 272, "setns": 308, "clone3": 435,
       "add_key": 248, "request_key": 249, "keyctl": 250}
# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET,
# the mask Docker's profile tests clone's flags with.
CLONE_NEW_ANY = 0x7E020000
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
EPERM, ENOSYS = 1, 38
# The capabilities Docker grants a container's root by default (capability numbers).
DOCKER_CAPS = {0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31}   # CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID
# SETUID SETPCAP NET_BIND_SERVICE NET_RAW SYS_CHROOT MKNOD AUDIT_WRITE SETFCAP

# classic BPF: load a word of struct seccomp_data, jump if equal / any bit set / greater or equal, return
LD_ABS, JEQ, JSET, JGE, RET = 0x20, 0x15, 0x45, 0x35, 0x06
NR, ARCH, ARG0 = 0, 4, 16   # offsets in struct seccomp_data (arg 0's low 32 bits, little-endian)
REFUSED = [("unshare", "eperm"), ("setns", "eperm"), ("mount", "eperm"), ("umount2", "eperm"),
           ("pivot_root", "eperm"), ("clone3", "enosys"), ("add_key", "eperm"), ("request_key", "eperm"),
           ("keyctl", "eperm")]


def program() -> list[tuple[int, int, int, int]]:
    """The filter as (code, jump if true, jump if false, k); jumps name a label (None: the next)."""
    labelled = [
        (None, LD_ABS, ARCH, None, None),
        (None, JEQ, AUDIT_ARCH_X86_64, None, "eperm"),   # another architecture's calls: refused
        (None, LD_ABS, NR, None, None),
        (None, JGE, X32_SYSCALL_BIT, "eperm", None),      # x32 calls: refused
        *((None, JEQ, SYS[name], errno, None) for name, errno in REFUSED),
        (None, JEQ, SYS["clone"], None, "allow"),
        (None, LD_ABS, ARG0, None, None),
        (None, JSET, CLONE_NEW_ANY, "eperm", None),
        ("allow", RET, RET_ALLOW, None, None),
        ("eperm", RET, RET_ERRNO | EPERM, None, None),
        ("enosys", RET, RET_ERRNO | ENOSYS, None, None),
    ]
    at = {label: i for i, (label, *_) in enumerate(labelled) if label}
    jump = lambda i, label: 0 if label is None else at[label] - i - 1   # noqa: E731
    return [(code, jump(i, jt), jump(i, jf), k) for i, (_, code, k, jt, jf) in enumerate(labelled)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def confine():
    """Drop the capabilities Docker does not grant, then install the filter (for good)."""
    if platform.machine() != "x86_64":
        raise OSError("this filter is written for x86_64")
    libc = ctypes.CDLL(None, use_errno=True)
    last_cap = int(open("/proc/sys/kernel/cap_last_cap").read())
    if os.geteuid() == 0:
        for cap in range(last_cap + 1):
            if cap not in DOCKER_CAPS and libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), f"PR_CAPBSET_DROP {cap}")
    insns = program()
    code = b"".join(struct.pack("=HBBI", *insn) for insn in insns)
    fprog = SockFprog(len(insns), code)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")


if __name__ == "__main__":
    confine()
    os.execvp(sys.argv[1], sys.argv[1:])
