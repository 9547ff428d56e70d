"""The judge in a student bundle (see ``graders/classroom/release.py``, which builds bundles).

A bundle is the kit without its answers: no reference/ package, no bug oracles, no hidden checks.
``graders/recorded/`` holds instead, per kata, every oracle value its public checks ask for at one
seed, and the hidden checks' ids and names, which the runner reports as skipped: they run when an
instructor grades. ``bundle.json`` there marks a kit as a bundle.
"""
from __future__ import annotations

import json
from functools import cache

from .manifest import ROOT, Kata
from .plugin import check_entry
from .recording import Store

RECORDED = ROOT / "graders" / "recorded"
MARKER = RECORDED / "bundle.json"
HIDDEN_MESSAGE = "hidden check: it runs, on fresh inputs, when your instructor grades"
NO_REFERENCE = ("This is a student bundle: it does not include the reference solutions or the bug oracles, "
                "so `kata {command}` cannot run here. Ask your instructor, or use the full kit.")


@cache
def bundle_info() -> dict | None:
    """The bundle's description ({"seed", "katas"}), or None in the full kit."""
    return json.loads(MARKER.read_text(encoding="utf-8")) if MARKER.exists() else None


def recording(kata: Kata) -> tuple[dict, Store] | None:
    """(info, recorded values) of ``kata`` in a bundle; None in the full kit."""
    return _recording(kata.module) if bundle_info() is not None else None


@cache
def _recording(module: str) -> tuple[dict, Store]:
    return Store.load(RECORDED / f"{module}.json", RECORDED / f"{module}.npz")


def hidden_report(check_id: str, name: str) -> dict:
    return check_entry(check_id, name, status="skipped", points=0.0, message=HIDDEN_MESSAGE, visibility="hidden")
