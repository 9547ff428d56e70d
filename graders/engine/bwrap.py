"""What a sandbox sees under bubblewrap: the ``bwrap`` command line that starts a zygote.

The zygote runs in its own user (unless the caller is root), pid, mount, network, IPC and UTS
namespaces, dies with its parent, runs under a seccomp filter (see seccomp.py), and sees a
read-only filesystem built from nothing: the system's shared libraries (/usr/lib), the Python
installation's standard library and interpreter, and of its site-packages only the distributions
a worker imports (NumPy, torch and what they require), bound one by one. Every site-packages
folder and checkout of the kit that lies inside a bound tree is covered by an empty tmpfs first,
so the kit itself (``reference/``, ``graders/``), a checkout beside the interpreter or under /usr,
HOME, the class's folders and everything else simply do not exist in there. The zygote forks each
worker into namespaces of its own (see ``worker.zygote``).

As root the zygote stays root outside any user namespace (with the few capabilities it needs to
make those namespaces) and each worker becomes an unprivileged user of its own; otherwise the
user namespace maps the caller, and each worker drops every capability.
"""
from __future__ import annotations

import _ctypes   # an extension module: its folder is lib-dynload, which the worker needs
import csv
import functools
import importlib.metadata
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

from . import seccomp
from .manifest import ROOT

INSTALL = "apt-get install bubblewrap"
WORKER = "/kata/worker.py"   # where the worker's own source is bound, alone
ZYGOTE_TMP_BYTES = 1 << 20   # the zygote writes nothing; each worker mounts its own /tmp
# CAP_NET_ADMIN: to bring up the loopback of a rank group's own network (worker._fork_isolated).
ROOT_CAPS = ("CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_NET_ADMIN")
FRAMEWORKS = ("numpy", "torch", "triton")   # what the katas' learner code may import (triton where installed)


class Unavailable(Exception):
    """bwrap is missing, or cannot make a sandbox on this machine."""


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def distributions(frameworks) -> list[importlib.metadata.Distribution]:
    """The installed distributions the worker may import: the frameworks and everything they
    require (extras excluded), found through the installed metadata."""
    found, todo = {}, list(frameworks)
    while todo:
        name = todo.pop()
        if _key(name) in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found[_key(name)] = dist
        for requirement in dist.requires or ():
            if not re.search(r"\bextra\s*==", requirement):
                todo.append(re.match(r"[A-Za-z0-9._-]+", requirement).group(0))
    return list(found.values())


def _dist_paths(dist) -> set[Path]:
    """What to bind for one distribution: its top-level packages, its metadata folder and its
    top-level modules (files, never the shared __pycache__ folder or .pth files). RECORD is read
    as text: torch's lists tens of thousands of files, too many for ``dist.files`` at each check."""
    base = Path(dist.locate_file(""))
    record = dist.read_text("RECORD")
    if record is None:   # no RECORD: the top-level names and the metadata folder
        names = (dist.read_text("top_level.txt") or "").split()
        return {p for n in names for p in (base / n, base / f"{n}.py") if p.exists()} | {Path(dist._path)}
    names = set()
    for line in record.splitlines():
        name = next(csv.reader([line]))[0] if line.startswith('"') else line.split(",", 1)[0]
        top, slash, _ = name.partition("/")
        if top != ".." and not name.endswith(".pth"):
            names.add(name if top == "__pycache__" or not slash else top)
    return {base / name for name in names if (base / name).exists()}


def _inside(path: Path, trees) -> bool:
    return any(path == tree or tree in path.parents for tree in trees)


def seccomp_fd() -> int:
    """A file descriptor holding the zygote's seccomp filter, for ``command``'s ``seccomp_fd``."""
    try:
        program = seccomp.zygote()
    except seccomp.Unavailable as exc:
        raise Unavailable(str(exc)) from None
    fd = os.memfd_create("kata-seccomp")
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def command(frameworks, *, cuda: bool = False, warm: bool = False, seccomp_fd: int | None = None) -> list[str]:
    """The bwrap command line that runs the zygote ``python -I WORKER FRAMEWORKS isolated [warm]``,
    under the seccomp filter that ``seccomp_fd`` holds (see ``seccomp_fd``; the caller passes it on)."""
    exe = shutil.which("bwrap")
    if exe is None:
        raise Unavailable(f"bubblewrap (bwrap) is not installed (`{INSTALL}`)")
    args = [exe, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try"]
    if os.geteuid() == 0:
        for cap in ROOT_CAPS:
            args += ["--cap-add", cap]
    else:
        args += ["--unshare-user", "--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_NET_ADMIN"]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    args += _view()
    if cuda:
        for device in sorted(Path("/dev").glob("nvidia*")):
            args += ["--dev-bind", str(device), str(device)]
        args += ["--ro-bind", "/sys", "/sys"]
    return args + ["--remount-ro", "/", "--chdir", "/tmp", "--", sys.executable, "-I", WORKER, ",".join(frameworks),
                   "isolated", *(["warm"] if warm else [])]


# The system's shared libraries and programs: never /usr whole, where /usr/local/src may hold a checkout.
SYSTEM_TREES = (*map(Path, ("/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32")),
                *(Path("/") / name for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32")))


@functools.cache
def readable_paths() -> tuple[str, ...]:
    """What a worker may read where no namespace can hide the rest (a grading container, through
    Landlock: worker.restrict_reads): what ``_view`` shows, as the real paths. Landlock allows
    trees and cannot cover a folder inside one, so the kit's own installed files stay protected by
    their permissions (sandbox.container_problem); a copy anywhere else (a clone beside it) is
    simply out of reach."""
    paths = [*(path.resolve() for path in SYSTEM_TREES if path.exists()), Path("/etc/ld.so.cache"),
             Path("/proc"), Path("/dev"), Path("/sys"),
             Path(os.__file__).parent, Path(_ctypes.__file__).parent, Path(sys.executable).resolve()]
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        paths.append(Path(sysconfig.get_config_var("LIBDIR")) / sysconfig.get_config_var("INSTSONAME"))
    interpreter = Path(sys.executable)
    paths += [config for config in (interpreter.parent / "pyvenv.cfg", interpreter.parent.parent / "pyvenv.cfg")
              if config.is_file()]
    paths += [path for dist in distributions(FRAMEWORKS) for path in sorted(_dist_paths(dist))]
    return tuple(dict.fromkeys(str(path) for path in paths if path.exists()))


@functools.cache
def _view() -> list[str]:
    """The filesystem's part of the command line (once a process: it reads the packages' RECORDs).

    Built from what the interpreter needs, wherever the kit lies: the system's shared libraries
    (/usr/lib and its siblings, never /usr whole, where /usr/local/src may hold a checkout of the
    kit), Python's own files and the workers' distributions. A checkout of the kit that lies inside
    a bound tree all the same is covered by an empty tmpfs, as site-packages are."""
    # bwrap would make the folders above each destination private (0700): made readable first.
    args = ["--perms", "0755", "--dir", "/usr", "--perms", "0755", "--dir", "/etc"]
    whole = []   # trees bound as they are
    for path in SYSTEM_TREES:
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
            whole.append(path)
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(ZYGOTE_TMP_BYTES), "--tmpfs", "/tmp"]
    covered = [ROOT] if _inside(ROOT, whole) else []
    for folder in covered:
        args += ["--tmpfs", str(folder)]
    trees = []   # bound below, whole

    def shown(path: Path) -> bool:
        return _inside(path, trees) or (_inside(path, whole) and not _inside(path, covered))

    # The interpreter and its standard library; in a virtual environment, its pyvenv.cfg too.
    binds = []   # (source, destination), bound read-only in this order
    for folder in sorted({Path(os.__file__).parent, Path(_ctypes.__file__).parent}):
        if not shown(folder):
            binds.append((folder, folder))
            trees.append(folder)
    interpreter = Path(sys.executable)
    if not shown(interpreter):
        binds.append((interpreter.resolve(), interpreter))
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        lib = Path(sysconfig.get_config_var("LIBDIR")) / sysconfig.get_config_var("INSTSONAME")
        if lib.exists() and not shown(lib):
            binds.append((lib.resolve(), lib))
    for config in (interpreter.parent / "pyvenv.cfg", interpreter.parent.parent / "pyvenv.cfg"):
        if config.is_file():   # where Python looks (sys.prefix says so only once site.py has run)
            binds.append((config, config))

    # Site-packages: hidden wherever they show, then the worker's distributions.
    site_dirs = {Path(p) for p in [*site.getsitepackages(), site.getusersitepackages()]}
    site_dirs |= {Path(sysconfig.get_path(key, vars=base)) for key in ("purelib", "platlib")
                  for base in ({}, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix})}
    hidden = sorted(d for d in site_dirs if d.is_dir() and shown(d))
    # Both frameworks whatever the zygote preloads: a NumPy kata's learner may import torch (and
    # be told it is a banned API), and must not be told it is missing.
    packages = [(path, path) for dist in distributions(FRAMEWORKS) for path in sorted(_dist_paths(dist))]
    worker = [(Path(__file__).with_name("worker.py"), Path(WORKER))]

    made = set()
    for _, dest in binds + packages + worker:
        for folder in reversed(dest.parents[:-1]):
            if folder not in made and not shown(folder) and not _inside(folder, hidden):
                made.add(folder)
                args += ["--perms", "0755", "--dir", str(folder)]
    for source, dest in binds:
        args += ["--ro-bind", str(source), str(dest)]
    for folder in hidden:
        args += ["--tmpfs", str(folder)]
    for source, dest in packages + worker:
        args += ["--ro-bind", str(source), str(dest)]
    for folder in hidden + covered:
        args += ["--remount-ro", str(folder)]
    return args


@functools.cache
def problem() -> str | None:
    """None when bwrap can make a sandbox here, else a sentence saying why not (once a process)."""
    try:
        fd = seccomp_fd()
        args = command(["numpy"], seccomp_fd=fd)
        seccomp.request()   # the workers' filter too
    except (Unavailable, seccomp.Unavailable) as exc:
        return str(exc)
    probe = args[:args.index("--") + 1] + [sys.executable, "-I", "-S", "-V"]   # the interpreter starts
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
                              pass_fds=(fd,))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap (bwrap) could not start a sandbox: {exc}"
    finally:
        os.close(fd)
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return f"bubblewrap (bwrap) could not start a sandbox here ({said})"
    return None
