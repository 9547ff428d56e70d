"""The trusted runner: grade one learner file for one kata and return the result object.

The sandbox is started first, so that its zygote's ``import torch`` overlaps the runner's own
imports; a caller grading many files passes one warm ``Zygote`` for all of them. The kata's
grader then runs under pytest in this process with the GradingPlugin; the result is built from
the plugin's per-check reports, never from pytest's exit code. ``grade_seeds`` grades one file at
several seeds in one pytest session, each seed in a sandbox of its own.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import secrets
import time
from pathlib import Path

from . import bundle, tape
from .manifest import ROOT, TORCH_FRAMEWORKS, Kata
from .oracles import code_of
from .recording import Book, Store
from .sandbox import Sandbox, SandboxUnusable, Zygote
from .structure import TAMPERING
from .untrusted import too_large

DEVICES = ("auto", "cpu", "cuda")
# pytest's builtin plugins that no grader uses, blocked so that no run calls their hooks (up to 3 ms
# a grading).
UNUSED_PLUGINS = ("unittest", "doctest", "legacypath", "tmpdir", "monkeypatch", "recwarn", "pastebin", "junitxml",
                  "setuponly", "setupplan", "stepwise", "debugging", "subtests")


# A grading's CPU-time budget for all its calls together (sandbox.Spent): GRADING_FACTOR times
# what the kata's reference spends (measured by benchmarks/reference_cpu.py into REFERENCE_CPU),
# at least GRADING_FLOOR_S. A correct solution twenty times slower than the reference still has
# time; a file that waits or loops holds its slot in a class run for minutes at most, not an hour.
REFERENCE_CPU = ROOT / "katas" / "reference-cpu.json"
GRADING_FACTOR, GRADING_FLOOR_S = 20, 60.0


@functools.cache
def _reference_cpu() -> dict:
    """REFERENCE_CPU's table, read once a process (a class run grades many pairs)."""
    try:
        table = json.loads(REFERENCE_CPU.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}


def grading_budget(kata: Kata) -> float:
    """The CPU seconds a grading of ``kata`` may spend in the learner's code (see above)."""
    try:
        measured = float(_reference_cpu().get(kata.slug, 0.0))
    except (TypeError, ValueError):
        measured = 0.0
    return max(GRADING_FLOOR_S, GRADING_FACTOR * measured)


class RunnerError(Exception):
    """The kit itself could not grade (a broken grader, no CUDA where it was asked for)."""


def new_seed() -> int:
    return secrets.randbelow(2**31)


def resolve_device(kata: Kata, device: str) -> str:
    if device not in DEVICES:
        raise RunnerError(f"--device must be one of {', '.join(DEVICES)}, not {device!r}.")
    if device == "cpu":
        return "cpu"
    if kata.framework not in TORCH_FRAMEWORKS and device == "auto" and not Path("/dev/nvidiactl").exists():
        return "cpu"   # spares NumPy katas an `import torch` where there is no GPU to find
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if device == "cuda":
        raise RunnerError("--device cuda was asked for, but torch sees no CUDA device here.")
    return "cpu"


# What a kata's framework needs beyond the kit's own requirements, and how to install it.
TRITON_INSTALL = "pip install 'attention-katas[triton]'   # or: pip install triton"


def needs_installing(kata: Kata) -> str | None:
    """Why ``kata`` cannot be graded here (a Triton kata where Triton is not installed), as a
    sentence that says how to install it; None when it can."""
    if kata.framework == "triton" and importlib.util.find_spec("triton") is None:
        return (f"{kata.slug} is a Triton kata, and Triton is not installed here. Install it with "
                f"`{TRITON_INSTALL}` (Linux; its interpreter runs the kernels on the CPU). Every other kata works "
                "without it.")
    return None


def _may_use_cuda(kata: Kata, device: str) -> bool:
    return kata.framework in TORCH_FRAMEWORKS and device != "cpu" and Path("/dev/nvidiactl").exists()


def zygote_for(katas: list[Kata], device: str, *, warm: bool = False) -> Zygote:
    """A zygote for self-study gradings of ``katas`` on ``device``: under bwrap where it can be had
    (else a plain process, see ``sandbox.fallback_note``). One zygote serves every grading of a
    `kata check` of several katas or of a `kata watch` session, so that each costs a fork, not a
    Python start and an ``import torch``; ``warm`` for such a one (see ``worker.zygote``)."""
    try:
        return Zygote([k.framework for k in katas], isolated=None, cuda=any(_may_use_cuda(k, device) for k in katas),
                      warm=warm)
    except SandboxUnusable as exc:
        raise RunnerError(str(exc)) from None


@contextlib.contextmanager
def sandbox_for(kata: Kata, file: Path, *, device: str, zygote: Zygote | None = None):
    """A started sandbox running ``file`` under ``kata``'s limits, forked from ``zygote`` or from
    a zygote of its own (under bwrap where it can be had: self-study falls back to a plain
    process, see ``sandbox.fallback_note``); everything it started is closed on exit. A file too
    large to be a kata's is refused before the sandbox reads it whole."""
    refused = too_large(file)
    if refused is not None:
        raise RunnerError(refused)
    may_use_cuda = _may_use_cuda(kata, device)
    own_zygote = zygote is None
    if own_zygote:
        zygote = zygote_for([kata], device)
    try:
        sandbox = Sandbox(file, zygote=zygote, framework=kata.framework, module_name=kata.module, allow=kata.allow,
                          budget_s=grading_budget(kata),
                          timeout_s=kata.timeout_s, import_timeout_s=kata.import_timeout_s,
                          memory_mb=kata.memory_mb, data_limit=not may_use_cuda,
                          # CUDA's driver starts threads of its own
                          spawn=kata.framework not in TORCH_FRAMEWORKS or may_use_cuda).start()
        try:
            yield sandbox
        finally:
            sandbox.close()
    finally:
        if own_zygote:
            zygote.close()


def grade(kata: Kata, file: Path, *, seed: int | None = None, device: str = "auto",
          zygote: Zygote | None = None, hidden_seed: int | None = None, record: Store | None = None,
          trace=None, repro: Path | None = None) -> dict:
    """Grade ``file`` against ``kata``; always returns a complete result (see docs/security.md).

    Hidden checks draw their values from ``hidden_seed`` (fresh when None: a class's grading run).
    ``record`` keeps every oracle value the graders use (how `kata release` records a bundle). In a
    student bundle the public checks replay its recordings and the hidden checks are skipped.
    ``trace`` (a hashlib object) takes every value the learner's code answers with. ``repro``: a
    folder that the calls of each failed public check are saved in (tape.save), for `kata repro`.
    """
    seed = new_seed() if seed is None else seed
    return _grade(kata, Path(file), [(seed, hidden_seed)], device=device, zygote=zygote, record=record,
                  trace=trace, repro=None if repro is None else {0: repro})[0]


def grade_seeds(kata: Kata, file: Path, seeds: list[int], *, device: str = "auto",
                zygote: Zygote | None = None, sandbox=None, plugins=()) -> list[dict]:
    """``grade(kata, file, seed=s, hidden_seed=s)`` for each ``s`` of ``seeds``, in one pytest
    session: each seed runs every check in a sandbox of its own, as its own grading would, while
    pytest starts and collects the grader once (with the sandboxes' forks overlapped, a sixth of a
    grading's time, a quarter of a small one's). ``sandbox`` and ``plugins``: see ``_grade``."""
    return _grade(kata, Path(file), [(seed, seed) for seed in seeds], device=device, zygote=zygote,
                  sandbox=sandbox, plugins=plugins)


class Grading:
    """One grading of the file in a pytest session: its seeds, its Book, its sandbox and, once the
    plugin has run its checks, their ``reports``. ``open`` starts the sandbox (the plugin opens the
    next grading's while this one runs: its fork overlaps these checks); ``start`` marks when the
    grading began (the first one's before pytest starts, so that its zygote's imports overlap
    pytest's); ``finish`` closes the sandbox and times the grading."""

    def __init__(self, seed: int, hidden_seed: int | None, book: Book, sandbox, repro: Path | None = None):
        self.seed, self.hidden_seed, self.book = seed, hidden_seed, book
        self.sandbox, self.reports, self.duration_s = None, {}, None
        self.repro, self.tapes = repro, {}   # where to save the tapes of the failed public checks, and they
        self._new_sandbox, self._stack = sandbox, contextlib.ExitStack()   # ``sandbox()``: a context manager
        self._started = None

    def open(self):
        if self.sandbox is None:
            self.sandbox = self._stack.enter_context(self._new_sandbox())

    def start(self):
        if self._started is None:
            self._started = time.perf_counter()
        self.open()

    def finish(self):
        self.close()
        self.duration_s = round(time.perf_counter() - self._started, 3)

    def close(self):
        self._stack.close()


def grade_files(kata: Kata, runs: list[tuple[Path, int]], *, device: str = "auto",
                zygote: Zygote | None = None, repro: dict[int, Path] | None = None) -> list[dict]:
    """``grade(kata, file, seed=s, hidden_seed=s)`` for each (file, s) of ``runs``, in one pytest
    session, as ``grade_seeds`` does for one file: each in a sandbox of its own. ``repro``: {index
    into ``runs``: the folder its failed public checks' tapes are saved in}."""
    return _grade(kata, None, [(seed, seed) for _, seed in runs], device=device, zygote=zygote,
                  files=[Path(file) for file, _ in runs], repro=repro)


def _grade(kata: Kata, file: Path | None, seeds: list[tuple[int, int | None]], *, device: str,
           zygote: Zygote | None, record: Store | None = None, trace=None, sandbox=None, plugins=(),
           files: list[Path] | None = None, repro: dict[int, Path] | None = None) -> list[dict]:
    """Grade ``file`` (or each of ``files``, one per item of ``seeds``) at each (seed, hidden_seed)
    of ``seeds`` in one pytest session. ``sandbox`` makes each grading's sandbox (a context
    manager), ``sandbox_for``'s by default; ``plugins`` join the session beside the grading plugin."""
    files = files or [file] * len(seeds)
    if (missing := needs_installing(kata)) is not None:
        raise RunnerError(missing)

    def own(graded: Path):
        return sandbox or (lambda: sandbox_for(kata, graded, device=device, zygote=zygote))

    recorded = bundle.recording(kata)
    if recorded is not None:
        info, store = recorded
        if any(seed != info["seed"] for seed, _ in seeds):
            raise RunnerError(f"This student bundle recorded the expected values of {kata.slug} at seed "
                              f"{info['seed']}: check with that seed (the default here).")
        gradings = [Grading(seed, None, Book(replay=store), own(graded), (repro or {}).get(i))
                    for i, ((seed, _), graded) in enumerate(zip(seeds, files))]
    else:
        info = None
        # A Triton kata's oracles run on the interpreter: their values are kept for the process.
        memo = str(kata.dir) if kata.framework == "triton" else None
        gradings = [Grading(seed, new_seed() if hidden_seed is None else hidden_seed,
                            Book(record=record, memo=memo), own(graded), (repro or {}).get(i))
                    for i, ((seed, hidden_seed), graded) in enumerate(zip(seeds, files))]
    try:
        gradings[0].start()
        resolved = resolve_device(kata, device)
        _run_pytest(kata, gradings, plugins, device=resolved, release=info, trace=trace)
    finally:
        for grading in gradings:
            grading.close()
    results = [_result(kata, graded, grading, resolved, info) for graded, grading in zip(files, gradings)]
    for grading, result in zip(gradings, results):
        if grading.repro is not None:
            _save_tapes(grading, result)
    return results


def _save_tapes(grading: Grading, result: dict):
    """The tapes of the checks ``result`` failed, in its order, for `kata repro`. A folder that
    cannot be written leaves the run without them, never without its result."""
    failed = [c for c in result["checks"] if c["id"] in grading.tapes and c["status"] != "passed"]
    try:
        tape.save(grading.repro, {c["id"]: grading.tapes[c["id"]] for c in failed},
                  {"kata": result["kata"], "file": result["file"], "seed": result["seed"],
                   "names": {c["id"]: c["name"] for c in failed}})
    except OSError:
        pass


def _one_cause(kata: Kata, checks: list[dict]) -> list[dict]:
    """A check that failed where a check it builds on (the manifest's [builds_on]) failed with a
    diagnosis says "same cause" in one line, instead of its own advice, only where that is seen:
    the later check found the same mistake, or the kata's record shows the mistake's own bug
    oracles and zoo bugs failing the later check too. Order alone proves nothing (two mistakes can
    fail the two checks): otherwise the later check keeps its report, and where it names no
    mistake of its own it adds that the check it builds on failed as well. It scores 0 either way."""
    failed = {c["id"] for c in checks if c["status"] in ("failed", "error") and not c.get("not_started")}
    mistake = {c["id"]: c["diagnosis"] for c in checks}   # a check's own, or the one its cause has
    losses = _losses(kata)
    said = []
    for check in checks:
        causes = [c for c in kata.builds_on.get(check["id"], ()) if c in failed]
        if check["id"] in failed and causes:
            own = check["diagnosis"]
            same = next((c for c in causes if mistake[c] and (mistake[c] == own or
                                                              not own and check["id"] in losses.get(mistake[c], ()))),
                        None)
            if same:
                mistake[check["id"]] = mistake[same]
                check = {**check, "message": f"Same cause as `{same}`, which failed first, diagnosed {mistake[same]}: "
                                             "that mistake fails this check too. Fix it, then check again.",
                         "diagnosis": None, "same_cause_as": same}
            elif not own:
                check = {**check, "message": f"{check['message']}\nalso failed: `{causes[0]}`, which this check "
                                             "builds on: fixing that first may fix this one too."}
        said.append(check)
    return said


def _losses(kata: Kata) -> dict[str, set[str]]:
    """{diagnosis code: the checks its bug oracles and zoo bugs lose to it}, from the record `kata
    lint --deep` keeps beside the manifest (none: nothing is seen). An oracle graded through its
    shim is refused by the static scan, so the checks it loses to `tampering` say nothing of it."""
    try:
        subjects = json.loads(kata.files["record"].read_text(encoding="utf-8"))["subjects"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    losses: dict[str, set[str]] = {}
    for name, entry in subjects.items():
        kind, _, which = name.partition(" ")
        if kind == "oracle":
            code = code_of(which)
        elif kind == "zoo" and "__" in which:
            code = which.rpartition("__")[2]
        else:
            continue
        lost = entry.get("result", {}).get("lost", {})
        losses.setdefault(code, set()).update(c for c, d in lost.items() if d != TAMPERING or code == TAMPERING)
    return losses


def _result(kata: Kata, file: Path, grading: Grading, device: str, info: dict | None) -> dict:
    reports = grading.reports
    if info is not None:
        reports.update({cid: bundle.hidden_report(cid, name) for cid, name in info["hidden"].items()})
    checks = _one_cause(kata, [reports[cid] for cid in kata.checks])
    sandbox = grading.sandbox
    return {
        "kata": kata.slug,
        "file": str(file.resolve()),
        "status": _status(checks, sandbox.load_error is not None),
        "score": round(sum(c["score"] for c in checks), 6),
        "max_score": round(sum(c["max_score"] for c in checks), 6),
        "seed": grading.seed,
        "hidden_seed": grading.hidden_seed,
        "device": device,
        "sandbox": sandbox.zygote.containment,
        "duration_s": grading.duration_s,
        "checks": [{k: v for k, v in c.items() if k != "not_started"} for c in checks],
        "diagnoses": list(dict.fromkeys(c["diagnosis"] for c in checks if c["diagnosis"])),
        "notes": list(dict.fromkeys(code for c in checks for code in c.get("notes", ()))),
    }


def _status(checks: list[dict], load_failed: bool) -> str:
    if load_failed:
        return "error"
    counted = [c for c in checks if c["status"] != "skipped"]
    if all(c["status"] == "passed" for c in counted):
        return "passed"
    if all(c.get("not_started") for c in counted):
        return "not-started"
    return "failed"


def _run_pytest(kata: Kata, gradings: list[Grading], plugins=(), **run) -> None:
    """Run the kata's grader once, its checks once per grading (see GradingPlugin); each grading's
    reports are left in its ``reports``."""
    import pytest

    from . import plugin as fixtures
    from .plugin import GradingPlugin, grader_files

    plugin = GradingPlugin(kata, gradings, **run)
    paths = [str(p) for p in grader_files(kata)] if run["release"] is None else [str(kata.grader_path)]
    saved = {k: os.environ.pop(k, None) for k in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        code = pytest.main([*paths, "-p", "no:terminal", "-p", "no:cacheprovider", "-p", "no:warnings",
                            "-p", "no:logging", "-p", "no:faulthandler",
                            # these two end every run with gc.collect(): a third of a small grader's time
                            "-p", "no:unraisableexception", "-p", "no:threadexception",
                            *(arg for name in UNUSED_PLUGINS for arg in ("-p", f"no:{name}")),
                            "--noconftest", "-c", os.devnull, "--assert=plain", "--rootdir", str(ROOT / "graders"),
                            # A course's own katas each have a grader.py: imported by path, never by that name.
                            *(["--import-mode=importlib"] if kata.folder else [])],
                           plugins=[plugin, fixtures, *plugins])
    finally:
        os.environ.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
        os.environ.update({k: v for k, v in saved.items() if v is not None})
    if plugin.problems:
        raise RunnerError("\n".join(plugin.problems))
    if int(code) not in (0, 1):
        raise RunnerError(f"pytest could not run the grader {kata.grader_path} (exit {int(code)}).")
    hidden = set(run["release"]["hidden"] if run["release"] else ())
    for grading in gradings:
        missing = set(kata.checks) - set(grading.reports) - hidden
        if missing:
            raise RunnerError(f"{kata.slug}: the grader produced no report for {', '.join(sorted(missing))}.")
