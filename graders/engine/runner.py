"""The trusted runner: grade one learner file for one kata and return the result object.

The sandbox is started first, so that its zygote's ``import torch`` overlaps the runner's own
imports; a caller grading many files passes one warm ``Zygote`` for all of them. The kata's
grader then runs under pytest in this process with the GradingPlugin; the result is built from
the plugin's per-check reports, never from pytest's exit code.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import time
from pathlib import Path

from . import bundle
from .manifest import ROOT, Kata
from .recording import Book, Store
from .sandbox import Sandbox, SandboxUnusable, Zygote

DEVICES = ("auto", "cpu", "cuda")


class RunnerError(Exception):
    """The kit itself could not grade (a broken grader, no CUDA where it was asked for)."""


def new_seed() -> int:
    return secrets.randbelow(2**31)


def resolve_device(kata: Kata, device: str) -> str:
    if device not in DEVICES:
        raise RunnerError(f"--device must be one of {', '.join(DEVICES)}, not {device!r}.")
    if device == "cpu":
        return "cpu"
    if kata.framework != "torch" and device == "auto" and not Path("/dev/nvidiactl").exists():
        return "cpu"   # spares NumPy katas an `import torch` where there is no GPU to find
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if device == "cuda":
        raise RunnerError("--device cuda was asked for, but torch sees no CUDA device here.")
    return "cpu"


@contextlib.contextmanager
def sandbox_for(kata: Kata, file: Path, *, device: str, zygote: Zygote | None = None):
    """A started sandbox running ``file`` under ``kata``'s limits, forked from ``zygote`` or from
    a zygote of its own (under bwrap where it can be had: self-study falls back to a plain
    process, see ``sandbox.fallback_note``); everything it started is closed on exit."""
    may_use_cuda = kata.framework == "torch" and device != "cpu" and Path("/dev/nvidiactl").exists()
    own_zygote = zygote is None
    if own_zygote:
        try:
            zygote = Zygote([kata.framework], isolated=None, cuda=may_use_cuda)
        except SandboxUnusable as exc:
            raise RunnerError(str(exc)) from None
    try:
        sandbox = Sandbox(file, zygote=zygote, framework=kata.framework, module_name=kata.module,
                          timeout_s=kata.timeout_s, import_timeout_s=kata.import_timeout_s,
                          memory_mb=kata.memory_mb, data_limit=not may_use_cuda).start()
        try:
            yield sandbox
        finally:
            sandbox.close()
    finally:
        if own_zygote:
            zygote.close()


def grade(kata: Kata, file: Path, *, seed: int | None = None, device: str = "auto",
          zygote: Zygote | None = None, hidden_seed: int | None = None, record: Store | None = None,
          trace=None) -> dict:
    """Grade ``file`` against ``kata``; always returns a complete result (see DESIGN.md).

    Hidden checks draw their inputs from ``hidden_seed`` (fresh when None: a class's grading run).
    ``record`` keeps every oracle value the graders use (how `kata release` records a bundle). In a
    student bundle the public checks replay its recordings and the hidden checks are skipped.
    ``trace`` (a hashlib object) takes every value the learner's code answers with.
    """
    started = time.perf_counter()
    seed = new_seed() if seed is None else seed
    recorded = bundle.recording(kata)
    if recorded is not None:
        info, store = recorded
        if seed != info["seed"]:
            raise RunnerError(f"This student bundle recorded the expected values of {kata.slug} at seed "
                              f"{info['seed']}: check with that seed (the default here).")
        hidden_seed, book = None, Book(replay=store)
    else:
        info, book = None, Book(record=record)
        hidden_seed = new_seed() if hidden_seed is None else hidden_seed
    file = Path(file)
    with sandbox_for(kata, file, device=device, zygote=zygote) as sandbox:
        device = resolve_device(kata, device)
        reports = _run_pytest(kata, sandbox, seed=seed, device=device, hidden_seed=hidden_seed, book=book,
                              release=info, trace=trace)
    if info is not None:
        reports.update({cid: bundle.hidden_report(cid, name) for cid, name in info["hidden"].items()})
    checks = [reports[cid] for cid in kata.checks]
    return {
        "kata": kata.slug,
        "file": str(file.resolve()),
        "status": _status(checks, sandbox.load_error is not None),
        "score": round(sum(c["score"] for c in checks), 6),
        "max_score": round(sum(c["max_score"] for c in checks), 6),
        "seed": seed,
        "hidden_seed": hidden_seed,
        "device": device,
        "sandbox": "bwrap" if sandbox.zygote.isolated else "process",
        "duration_s": round(time.perf_counter() - started, 3),
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


def _run_pytest(kata: Kata, sandbox: Sandbox, **run) -> dict:
    import pytest

    from . import plugin as fixtures
    from .plugin import GradingPlugin, grader_files

    plugin = GradingPlugin(kata, sandbox, **run)
    paths = [str(p) for p in grader_files(kata)] if run["release"] is None else [str(kata.grader_path)]
    saved = {k: os.environ.pop(k, None) for k in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        code = pytest.main([*paths, "-p", "no:terminal", "-p", "no:cacheprovider", "-p", "no:warnings",
                            "-p", "no:logging", "-p", "no:faulthandler",
                            # these two end every run with gc.collect(): a third of a small grader's time
                            "-p", "no:unraisableexception", "-p", "no:threadexception",
                            "--noconftest", "-c", os.devnull, "--assert=plain", "--rootdir", str(ROOT / "graders")],
                           plugins=[plugin, fixtures])
    finally:
        os.environ.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
        os.environ.update({k: v for k, v in saved.items() if v is not None})
    if plugin.problems:
        raise RunnerError("\n".join(plugin.problems))
    if int(code) not in (0, 1):
        raise RunnerError(f"pytest could not run the grader {kata.grader_path} (exit {int(code)}).")
    missing = set(kata.checks) - set(plugin.reports) - set(run["release"]["hidden"] if run["release"] else ())
    if missing:
        raise RunnerError(f"{kata.slug}: the grader produced no report for {', '.join(sorted(missing))}.")
    return plugin.reports
