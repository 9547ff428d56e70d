"""The trusted runner: grade one learner file for one kata and return the result object.

The sandbox worker is started first, so that its ``import torch`` overlaps the runner's own
imports. The kata's grader then runs under pytest in this process with the GradingPlugin; the
result is built from the plugin's per-check reports, never from pytest's exit code.
"""
from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from .manifest import ROOT, Kata
from .sandbox import Sandbox

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


def grade(kata: Kata, file: Path, *, seed: int | None = None, device: str = "auto") -> dict:
    """Grade ``file`` against ``kata``; always returns a complete result (see DESIGN.md)."""
    started = time.perf_counter()
    seed = new_seed() if seed is None else seed
    file = Path(file)
    may_use_cuda = kata.framework == "torch" and device != "cpu" and Path("/dev/nvidiactl").exists()
    sandbox = Sandbox(file, framework=kata.framework, module_name=kata.module,
                      timeout_s=kata.timeout_s, import_timeout_s=kata.import_timeout_s,
                      memory_mb=kata.memory_mb, data_limit=not may_use_cuda).start()
    try:
        device = resolve_device(kata, device)
        reports = _run_pytest(kata, sandbox, seed, device)
    finally:
        sandbox.close()
    checks = [reports[cid] for cid in kata.checks]
    return {
        "kata": kata.slug,
        "file": str(file.resolve()),
        "status": _status(checks, sandbox.load_error is not None),
        "score": round(sum(c["score"] for c in checks), 6),
        "max_score": round(sum(c["max_score"] for c in checks), 6),
        "seed": seed,
        "device": device,
        "duration_s": round(time.perf_counter() - started, 3),
        "checks": [{k: v for k, v in c.items() if k != "not_started"} for c in checks],
        "diagnoses": list(dict.fromkeys(c["diagnosis"] for c in checks if c["diagnosis"])),
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


def _run_pytest(kata: Kata, sandbox: Sandbox, seed: int, device: str) -> dict:
    import pytest

    from . import plugin as fixtures
    from .plugin import GradingPlugin

    plugin = GradingPlugin(kata, sandbox, seed=seed, device=device)
    saved = {k: os.environ.pop(k, None) for k in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        code = pytest.main([str(kata.grader_path), "-p", "no:terminal", "-p", "no:cacheprovider",
                            "-p", "no:warnings", "--noconftest", "-c", os.devnull, "--assert=plain",
                            "--rootdir", str(ROOT / "graders")],
                           plugins=[plugin, fixtures])
    finally:
        os.environ.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
        os.environ.update({k: v for k, v in saved.items() if v is not None})
    if plugin.problems:
        raise RunnerError("\n".join(plugin.problems))
    if int(code) not in (0, 1):
        raise RunnerError(f"pytest could not run the grader {kata.grader_path} (exit {int(code)}).")
    missing = set(kata.checks) - set(plugin.reports)
    if missing:
        raise RunnerError(f"{kata.slug}: the grader produced no report for {', '.join(sorted(missing))}.")
    return plugin.reports
