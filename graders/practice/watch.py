"""Watching learner files for `kata watch`: yield a file each time its content changes.

Two strategies. Events: watchdog watches each file's folder and matches events by file name,
so every way an editor saves is seen (write in place; write a temporary file and rename it over,
like vim and JetBrains; delete and recreate). Polling: each file's stat every ``interval``
seconds. Events fall back to polling, saying so once, when the observer cannot start or when a
cheap stat check sees a file change that no event reported (NFS, 9p, vboxsf ...). Either way a
change counts once the file has been quiet for QUIET_S (never read half-written) and only if its
content hash differs from the last one seen (a touch, or a save that changes nothing, is no
change). The files are only ever read.

``changed`` says, in one line, what a re-check changed since the check before it.
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from watchdog.events import EVENT_TYPE_CLOSED_NO_WRITE, EVENT_TYPE_OPENED, FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

QUIET_S = 0.2   # a save must be this quiet before the file is read
AUDIT_S = 2.0   # how often event mode makes sure that events still arrive
READS = {EVENT_TYPE_OPENED, EVENT_TYPE_CLOSED_NO_WRITE}   # our own hashing and grading read the file


def _stat(path: Path) -> tuple | None:
    """What a save changes, cheaply: inode (rename-over), size and modification time."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:   # deleted, or mid-way through a delete-and-recreate save
        return None


class _Handler(FileSystemEventHandler):
    """Marks a watched file as touched when an event names it (as source or as rename target)."""

    def __init__(self, watcher: Watcher):
        self.watcher = watcher

    def on_any_event(self, event: FileSystemEvent):
        if event.event_type in READS:
            return
        for name in (event.src_path, event.dest_path):
            path = Path(os.fsdecode(name)) if name else None
            if path in self.watcher.hashes:
                self.watcher.touch(path, evented=True)


class Watcher:
    """Watches ``files`` by events (or by polling with ``poll``); ``changes()`` yields each file
    whose content changed. ``say`` prints the one line that announces a switch to polling;
    ``observer`` is the watchdog observer class events come from."""

    def __init__(self, files: Iterable[Path], *, poll: bool = False, interval: float = 0.5,
                 say: Callable[[str], object] = print, observer: Callable[[], object] = Observer):
        self.interval = interval
        self.say = say
        self.hashes = {path: _digest(path) for path in (Path(f).absolute() for f in files)}
        self._stats = {f: _stat(f) for f in self.hashes}
        self._audited = dict(self._stats)
        self._touched: dict[Path, float] = {}    # file -> when it last showed activity
        self._evented: set[Path] = set()         # files an event named since the last audit
        self._suspects: set[Path] = set()        # files that changed with no event, at the last audit
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._observer = None
        self.polling = poll
        if not poll:
            self._start(observer)

    def _start(self, observer_class):
        observer, handler = observer_class(), _Handler(self)
        try:
            for folder in {f.parent for f in self.hashes}:
                observer.schedule(handler, str(folder))
            observer.start()
        except OSError as exc:   # e.g. the inotify watch limit, an unsupported file system
            self._fall_back(f"cannot watch for change events here ({exc})")
            return
        self._observer = observer

    def _fall_back(self, why: str):
        self.say(f"{why}; polling every {self.interval:g} s instead")
        self.polling = True
        if self._observer is not None:
            self._observer.stop()
        for path in self.hashes:   # a change the events missed is found by its hash
            self.touch(path)

    def touch(self, path: Path, *, evented: bool = False):
        """Record activity on ``path``: it is looked at again once quiet."""
        with self._lock:
            self._touched[path] = time.monotonic()
            if evented:
                self._evented.add(path)
        self._wake.set()

    def close(self):
        """Stop watching: ``changes()`` returns."""
        self._closed = True
        self._wake.set()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join()

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc):
        self.close()

    def changes(self) -> Iterator[Path]:
        """Each watched file whose content changed, once it has been quiet; until ``close()``."""
        next_poll = next_audit = time.monotonic()
        while not self._closed:
            now = time.monotonic()
            if self.polling and now >= next_poll:
                self._poll()
                next_poll = now + self.interval
            elif not self.polling and now >= next_audit:
                self._audit()
                next_audit = now + AUDIT_S
            for path in self._quiet(now):
                digest = _digest(path)
                if digest is not None and digest != self.hashes[path]:
                    self.hashes[path] = digest
                    yield path
            with self._lock:
                due = [t + QUIET_S for t in self._touched.values()]
            wake_at = min([next_poll if self.polling else next_audit, *due])
            self._wake.wait(max(0.0, wake_at - time.monotonic()))
            self._wake.clear()

    def _quiet(self, now: float) -> list[Path]:
        """Touched files quiet for QUIET_S, by events and by stat; a file still moving is touched again."""
        with self._lock:
            ready = [p for p, t in self._touched.items() if now - t >= QUIET_S]
            for path in ready:
                del self._touched[path]
        quiet = []
        for path in ready:
            stat = _stat(path)
            if stat != self._stats[path]:
                self._stats[path] = stat
                self.touch(path)
            else:
                quiet.append(path)
        return quiet

    def _poll(self):
        for path in self.hashes:
            stat = _stat(path)
            if stat != self._stats[path]:
                self._stats[path] = stat
                self.touch(path)

    def _audit(self):
        """Fall back to polling when a file changed and no event named it by the next audit."""
        with self._lock:
            evented, self._evented = self._evented, set()
        for path in self.hashes:
            stat = _stat(path)
            if path in evented:
                self._suspects.discard(path)
            elif path in self._suspects:
                self._fall_back("change events are not arriving from this file system")
                return
            elif stat != self._audited[path]:
                self._suspects.add(path)
            self._audited[path] = stat


def changed(before: dict, after: dict) -> str:
    """What a check of a saved file changed since the check before it: the checks it now passes,
    those it now fails, and how many stayed as they were (a check that did not run on this
    machine, such as a CUDA one without a GPU, counts nowhere)."""
    was = {c["id"]: c["status"] == "passed" for c in before["checks"] if c["status"] != "skipped"}
    now = {c["id"]: c["status"] == "passed" for c in after["checks"] if c["status"] != "skipped"}
    fixed = [check for check, ok in now.items() if ok and was.get(check) is False]
    broken = [check for check, ok in now.items() if not ok and was.get(check) is True]
    same = sum(was.get(check) is ok for check, ok in now.items())
    said = [f"{what}: {', '.join(checks)}" for what, checks in (("now passes", fixed), ("now fails", broken)) if checks]
    return "Since the last save: " + "; ".join([*said, f"{same} check{'s' * (same != 1)} unchanged"]) + "."
