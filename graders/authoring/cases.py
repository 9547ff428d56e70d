"""The structure of every check's cases at many seeds, from a dry run that grades nothing.

A dry run runs the kata's checks in this process against its reference, through the worker's own
request handler, with no sandbox: trusted code only, never a learner's file. What each check sends
the reference is kept as its signature (``draws.signature``: shapes, lengths, masks, every int and
bool, never a float value). A check whose signature differs between two seeds draws part of its
structure from the seed, and a known mistake could be caught at one seed and missed at the next.

What the dry run cannot follow it leaves out the same way at every seed: the ranks of a
torch.distributed group are not started (a check stops at its first ``learner.ranks``), and the
worker's memory reads as 0 bytes. A check that takes no ``rng`` draws nothing from the seed: it
runs at the first seed only.
"""
from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

import pytest

from ..engine.draws import signature
from ..engine.manifest import Kata
from ..engine.plugin import check_id
from ..engine.runner import grade_seeds
from ..engine.sandbox import SandboxError
from ..engine.worker import Worker, encode_frame, parse_frame

RANKS_NOT_RUN = "no ranks are started in process"
ONCE = "it draws no values: its cases are the same at every seed, so the dry run runs it once"


class _Current:
    """A pytest plugin that says which check is running, and runs a check that takes no ``rng``
    at the first seed only (ONCE)."""

    def __init__(self):
        self.check, self.seen = None, set()

    def pytest_runtest_setup(self, item):
        self.check = check_id(item)
        if self.check in self.seen and "rng" not in item.fixturenames:
            pytest.skip(ONCE)
        self.seen.add(self.check)


class InProcessSandbox:
    """What a ``Learner`` needs of a sandbox, answered in this process by ``Worker.handle`` on
    trusted source (a reference, never a learner's file): no process, no pipes, no isolation.
    Each request and reply still goes through the wire's framing, so that only the process
    boundary differs from a real sandbox; ``on_request(header, blobs)`` sees each request."""

    containment = "in process"

    def __init__(self, kata: Kata, source: bytes, folder: str, on_request=lambda header, blobs: None):
        self.kata, self.source_text, self.folder, self.on_request = kata, source, folder, on_request
        self.file_name, self.framework, self.allow = kata.learner_file, kata.framework, kata.allow
        self.timeout_s = kata.timeout_s
        self.zygote, self.load_error, self.loaded = self, None, None
        self.worker = Worker(None, None, kata.framework)

    def ensure_loaded(self) -> dict:
        if self.loaded is None:
            path = Path(self.folder) / self.file_name
            path.write_bytes(self.source_text)
            # A name of its own: the grader's module may be imported under the kata's.
            load = {"op": "load", "path": str(path), "name": f"_trusted_{self.kata.module}"}
            self.loaded, _ = self.worker.handle(load, [])
        return self.loaded

    def request(self, header: dict, blobs: list, timeout_s: float | None = None, what: str = "the call"):
        self.ensure_loaded()
        header, blobs = parse_frame(io.BytesIO(encode_frame(header, blobs)).read)
        self.on_request(header, blobs)
        return parse_frame(io.BytesIO(encode_frame(*self.worker.handle(header, blobs))).read)

    def start(self):
        return self

    def sibling(self, appended: bytes) -> InProcessSandbox:
        return InProcessSandbox(self.kata, self.source_text + appended, self.folder, self.on_request)

    def rank_group(self, world: int):
        raise SandboxError("in process", RANKS_NOT_RUN)

    def memory(self, held: bool = False) -> dict:
        return {"peak": 0, "held": 0}

    def reset_peak(self):
        pass

    def restart(self):
        pass

    def close(self):
        pass


def dry_run(kata: Kata, seeds: list[int]) -> dict[int, dict[str, dict]]:
    """{seed: {check id: its entry of the result, with "requests"}}: the kata's checks run dry on
    its reference at each of ``seeds`` (hidden checks at the same seed); ``requests`` holds the
    signature of each request a check sent the reference."""
    current, made = _Current(), []
    source = kata.files["reference"].read_bytes()
    with tempfile.TemporaryDirectory(prefix="kata-dry-") as folder:
        def sandbox():
            requests = {}   # check id -> the signature of each request it sent
            made.append(requests)
            keep = lambda header, blobs: requests.setdefault(current.check, []).append(signature(header, blobs))
            return contextlib.nullcontext(InProcessSandbox(kata, source, folder, keep))

        results = grade_seeds(kata, kata.files["reference"], seeds, device="cpu", sandbox=sandbox, plugins=[current])
    return {seed: {c["id"]: {**c, "requests": requests.get(c["id"], [])} for c in result["checks"]}
            for seed, result, requests in zip(seeds, results, made)}


def seed_dependent(kata: Kata, seeds: list[int]) -> dict[str, str]:
    """{check id: a sentence} for each check whose cases' structure is not the same at every one
    of ``seeds``, or that the dry run could not follow (a grader that failed on the reference):
    empty when there is none."""
    found = dry_run(kata, seeds)
    said = {}
    for cid in kata.checks:
        broke = next((s for s in seeds if _broke(found[s][cid])), None)
        if broke is not None:
            last = found[broke][cid]["message"].strip().splitlines()[-1].strip()
            said[cid] = f"{cid}: the dry run at seed {broke} stopped on the reference: {last}"
            continue
        first = found[seeds[0]][cid]["requests"]
        other = next((s for s in seeds[1:] if found[s][cid]["message"] != ONCE and found[s][cid]["requests"] != first),
                     None)
        if other is not None:
            said[cid] = _difference(cid, seeds[0], first, other, found[other][cid]["requests"])
    return said


def _broke(check: dict) -> bool:
    """Whether a grader failed on the reference in the dry run, other than where a dry run stops
    by design (ranks) or after a check that did."""
    return check["status"] == "error" and RANKS_NOT_RUN not in check["message"] and not check.get("same_cause_as")


def _difference(cid: str, a: int, at_a: list, b: int, at_b: list) -> str:
    """Where two signatures of a check part, in a sentence."""
    for i, (x, y) in enumerate(zip(at_a, at_b)):
        if x != y:
            what = f"{cid}: what it sends the learner's code differs between seed {a} and seed {b}, " \
                   f"at request {i + 1} ({x[0]} {'.'.join(map(str, (x[1] or [None, []])[1]))})"
            for where, (u, v) in _arguments(x, y):
                if u != v:
                    shown = (_describe(u), _describe(v))
                    return f"{what}, {where}: {shown[0]} against {shown[1]}" + \
                        (f" ({_entries(u)} differ)" if shown[0] == shown[1] else "")
            return what
    return f"{cid}: it sends the learner's code {len(at_a)} requests at seed {a} and {len(at_b)} at seed {b}"


def _arguments(x: list, y: list):
    """(where, (x's, y's)) for each argument of two request signatures, then the rest."""
    for i, pair in enumerate(zip(x[2] or [], y[2] or [])):
        yield f"argument {i + 1}", pair
    for key in sorted(set(x[3] or {}) | set(y[3] or {})):
        yield f"argument {key}=", ((x[3] or {}).get(key), (y[3] or {}).get(key))
    yield "the request", (x, y)


def _entries(value) -> str:
    """What differs between two values described alike: an array's entries (its integers and
    booleans), or where a float array holds inf, NaN or 0; else what is left out of the words."""
    if not (isinstance(value, list) and value and isinstance(value[0], str)):
        return "its contents"
    dtype = value[1] if value[0] == "tensor" else value[0]
    return "its entries" if any(kind in dtype for kind in ("int", "bool")) else "where it holds inf, NaN or 0"


def _describe(value) -> str:
    """A signature's value in a few words: an array or tensor by dtype and shape."""
    if isinstance(value, list) and value and value[0] == "tensor":
        return f"{value[1]} tensor of shape {tuple(value[2])}"
    if isinstance(value, list) and len(value) == 3 and isinstance(value[0], str) and isinstance(value[1], list):
        return f"{value[0]} array of shape {tuple(value[1])}"
    text = json.dumps(value)
    return text if len(text) <= 120 else text[:120] + " …"
