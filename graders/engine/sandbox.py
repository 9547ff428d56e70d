"""The trusted side of the sandbox: starts the worker, talks to it, and kills it when it misbehaves.

One ``Sandbox`` serves one learner file. The worker runs as ``python -I`` in its own session
(process group), in an empty temporary directory holding a copy of the learner's file, with a
scrubbed environment, a data-size limit and a per-request deadline. A request that outlives its
deadline, a worker that dies or that sends something that is not a well-formed reply gets the
process group killed; the next request starts a fresh worker.
"""
from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import worker as wire

WORKER = Path(wire.__file__)
STARTUP_TIMEOUT_S = 120.0   # importing torch on a cold, busy machine
MAX_TIMEOUTS = 2


class SandboxError(Exception):
    """The worker timed out, died, or broke the protocol; ``kind`` says which."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class LoadError(Exception):
    """The learner's file could not be loaded; ``error`` is the worker's description, if any."""

    def __init__(self, message: str, error: dict | None = None):
        super().__init__(message)
        self.error = error


def scrubbed_env(tmp: str) -> dict:
    env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8",
           "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
           # Small tensors: one thread is faster and keeps two sandboxes off each other's cores.
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
    return env


class Sandbox:
    def __init__(self, source: Path, *, framework: str, module_name: str, timeout_s: float,
                 import_timeout_s: float, memory_mb: int, data_limit: bool = True):
        self.source_text = Path(source).read_bytes()
        self.file_name = Path(source).name
        self.framework = framework
        self.module_name = module_name
        self.timeout_s = timeout_s
        self.import_timeout_s = import_timeout_s
        self.memory_mb = memory_mb
        # The kernel's data-size limit makes a hog fail with MemoryError; it is not applied where
        # a CUDA context may be created (untested with CUDA's host reservations). The RSS watch
        # in _wait caps memory either way.
        self.data_limit = data_limit
        self.proc = None
        self.loaded = None          # the load reply, once loaded
        self.load_error = None      # a LoadError, once loading failed: never retried
        self.stderr_tail = b""
        self.timeouts = 0

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self):
        """Spawn the worker now; it imports NumPy/torch while the caller does its own imports."""
        self.tmp = tempfile.mkdtemp(prefix="kata-sandbox-")
        (Path(self.tmp) / self.file_name).write_bytes(self.source_text)
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-I", str(WORKER), str(req_r), str(resp_w), self.framework,
             str(self.memory_mb if self.data_limit else 0)],
            cwd=self.tmp, env=scrubbed_env(self.tmp), pass_fds=(req_r, resp_w),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True)
        os.close(req_r)
        os.close(resp_w)
        os.set_blocking(self.req_w, False)
        self.stderr_open = True
        self.ready = False
        self.loaded = None
        return self

    def close(self):
        if self.proc is not None:
            self._kill()
            for fd in (self.req_w, self.resp_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.proc.stderr.close()
            self.proc = None
            shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()

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
                self._exchange(None, STARTUP_TIMEOUT_S, "starting the sandbox")
                self.ready = True
            reply, _ = self._exchange(({"op": "load", "path": self.file_name, "name": self.module_name}, []),
                                      self.import_timeout_s, f"importing {self.file_name}")
        except SandboxError as exc:
            self.load_error = LoadError(_load_message(exc, self.file_name, self.import_timeout_s))
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

    def _exchange(self, message, timeout_s: float, what: str):
        deadline = time.monotonic() + timeout_s
        if message is not None:
            self._send(*message, deadline=deadline, timeout_s=timeout_s, what=what)
        try:
            header, blobs = wire.read_frame(self.resp_r, wait=lambda: self._wait(deadline, timeout_s, what))
        except EOFError:
            raise self._died(what) from None
        except (ValueError, UnicodeDecodeError) as exc:
            self._kill()
            raise SandboxError("protocol", f"the sandbox sent a malformed reply during {what} ({exc}).") from None
        if "ok" not in header and header.get("op") != "ready":
            self._kill()
            raise SandboxError("protocol", f"the sandbox sent a malformed reply during {what}.")
        return header, blobs

    def _send(self, header, blobs, *, deadline, timeout_s, what):
        view = memoryview(wire.encode_frame(header, blobs))
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._kill()
                raise SandboxError("timeout", f"{what} did not finish within {timeout_s:g} s.")
            _, writable, _ = select.select([], [self.req_w], [], min(remaining, 0.1))
            if writable:
                try:
                    view = view[os.write(self.req_w, view):]
                except BrokenPipeError:
                    raise self._died(what) from None

    def _wait(self, deadline, timeout_s, what):
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._kill()
                raise SandboxError("timeout", f"{what} did not finish within {timeout_s:g} s: "
                                   "an endless loop, or work far too slow for these small inputs.")
            watched = [self.resp_r] + ([self.proc.stderr] if self.stderr_open else [])
            readable, _, _ = select.select(watched, [], [], min(remaining, 0.05))
            if self.proc.stderr in readable:
                chunk = os.read(self.proc.stderr.fileno(), 1 << 16)
                self.stderr_open = bool(chunk)   # closed by the learner's code: stop watching it
                self.stderr_tail = (self.stderr_tail + chunk)[-4096:]
            if self.resp_r in readable:
                return
            if self._rss_mb() > self.memory_mb:
                self._kill()
                raise SandboxError("memory", f"{what} used more than the sandbox's {self.memory_mb} MB "
                                   "of memory, so the sandbox was stopped.")

    def _rss_mb(self) -> float:
        try:
            with open(f"/proc/{self.proc.pid}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
        except (OSError, IndexError, ValueError):
            return 0.0

    def _died(self, what):
        code = self.proc.wait()
        tail = self.stderr_tail.decode("utf-8", "replace").strip().splitlines()[-1:] if self.stderr_tail else []
        if code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with status {code} (os._exit, or a crash)"
        detail = f" Last line on stderr: {tail[0]}" if tail else ""
        return SandboxError("crash", f"the sandbox process {how} during {what}.{detail}")


def _load_message(exc: SandboxError, file_name: str, timeout_s: float) -> str:
    if exc.kind == "timeout":
        return (f"importing {file_name} did not finish within {timeout_s:g} s: code at the top level "
                "of the file runs at import, so move long work into functions.")
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
