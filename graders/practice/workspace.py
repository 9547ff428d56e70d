"""The learner's workspace: their kata files, and the kit's state under ``.kata/``.

The state (``.kata/state.json``) records, per kata, the last status and the checks it failed, the
best score, the hints seen and whether it was ever passed. The history (``.kata/history.jsonl``,
see history.py) keeps every graded run and mock interview. It is written atomically (a temporary file, then ``os.replace``). A
corrupt state file is reported, kept aside as ``state.corrupt-<time>.json``, and replaced.
Nothing in the workspace is overwritten without a backup under ``.kata/backups/``.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from ..engine.manifest import Kata
from . import hints
from .history import History

STATE_FORMAT = 1


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


class Workspace:
    def __init__(self, root: Path | str):
        self.root = Path(root).expanduser().resolve()
        self.meta = self.root / ".kata"
        self.state_path = self.meta / "state.json"
        self.history = History(self.meta / "history.jsonl")
        self.warning: str | None = None
        self._corrupt = False
        self.state = self._load()

    def file_for(self, kata: Kata) -> Path:
        return self.root / kata.learner_file

    def kata_state(self, kata: Kata) -> dict:
        return self.state["katas"].setdefault(kata.slug, {})

    # --- state -------------------------------------------------------------------------------

    def _load(self) -> dict:
        empty = {"format": STATE_FORMAT, "katas": {}}
        if not self.state_path.exists():
            return empty
        try:
            state = json.loads(self.state_path.read_text(encoding="utf-8"))
            if not (isinstance(state, dict) and state.get("format") == STATE_FORMAT
                    and isinstance(state.get("katas"), dict)
                    and all(isinstance(v, dict) for v in state["katas"].values())):
                raise ValueError("not a format-1 state object")
            return state
        except (ValueError, UnicodeDecodeError, OSError) as exc:
            self._corrupt = True
            self.warning = (f"{self.state_path} is unreadable ({exc}); starting from an empty state. "
                            "It will be kept aside when the state is next saved.")
            return empty

    def save(self):
        self.meta.mkdir(parents=True, exist_ok=True)
        if self._corrupt and self.state_path.exists():
            os.replace(self.state_path, self.meta / f"state.corrupt-{time.strftime('%Y%m%d-%H%M%S')}.json")
            self._corrupt = False
        fd, tmp = tempfile.mkstemp(dir=self.meta, prefix=".state-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(self.state, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_path)

    def owns(self, kata: Kata, path: Path) -> bool:
        """Whether ``path`` is the kata's own file here: the workspace's file, or the notebook
        `kata notebook` made beside it. Any other is a scratch file."""
        own = self.file_for(kata)
        return Path(path).resolve() in (own.resolve(), own.with_suffix(".ipynb").resolve())

    def record_result(self, kata: Kata, result: dict, *, scratch: bool = False,
                      source: bytes | None = None) -> str | None:
        """Remember a graded run in the state and the history. A ``scratch`` run (of a file that
        is not the kata's own, see ``owns``) is marked so in the history, where no status or score
        counts it; only `kata hint` follows it, as it follows the last run. Where ``.kata/``
        cannot be written (another user's, a read-only folder), the grade still stands: the
        sentence that says it was not remembered is returned, for the caller to show. ``source``:
        the code graded, where ``result["file"]`` does not hold it (a notebook's check cell)."""
        entry = self.kata_state(kata)
        entry["failed"] = hints.failed_checks(result)
        if not scratch:
            entry["status"] = result["status"]
            entry["last_checked"] = _now()
            entry["last_score"] = result["score"]
            entry["max_score"] = result["max_score"]
            entry["best_score"] = max(float(entry.get("best_score", 0.0)), float(result["score"]))
            if result["status"] == "passed":
                entry["passed"] = True
                entry.setdefault("first_passed", _now())
        try:
            digest = hashlib.sha256(Path(result["file"]).read_bytes() if source is None else source).hexdigest()
        except OSError:
            digest = None
        try:
            self.save()
            self.history.append({"type": "check", "kata": kata.slug, "status": result["status"],
                                 "score": result["score"], "max_score": result["max_score"],
                                 "seed": result.get("seed"), "sha256": digest,
                                 **({"scratch": str(result["file"])} if scratch else {})})
        except OSError as exc:
            return (f"this result was not recorded in {self.meta} ({exc.strerror or exc}"
                    f"{f': {exc.filename}' if exc.filename else ''}), so `kata list` and `kata history` will not show it.")
        return None

    def take_hint(self, kata: Kata) -> tuple[hints.Choice, list | None]:
        """The next hint for what the last recorded run failed (see hints.py), recorded as seen,
        and the checks that run failed (None: the kata has no run)."""
        entry = self.kata_state(kata)
        taken = entry.get("hints_taken")
        # A state from before hints were aimed: its first hints_seen hints, in task order, were seen.
        seen = set(taken) if isinstance(taken, list) else set(range(int(entry.get("hints_seen", 0))))
        failed = entry.get("failed")
        choice = hints.choose(kata, seen, failed)
        if choice.index is not None:
            entry["hints_taken"] = sorted(seen | {choice.index})
            entry["hints_seen"] = len(entry["hints_taken"])
            self.save()
        return choice, failed

    # --- files -------------------------------------------------------------------------------

    def backup(self, path: Path) -> Path:
        folder = self.meta / "backups"
        folder.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = folder / f"{path.stem}.{stamp}{path.suffix}"
        n = 1
        while target.exists():
            target = folder / f"{path.stem}.{stamp}-{n}{path.suffix}"
            n += 1
        shutil.copy2(path, target)
        return target

    def started(self) -> list[Path]:
        return sorted(p for p in self.root.glob("*.py"))
