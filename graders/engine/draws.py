"""What a check draws: the structure of its cases from ``case_rng``, the same at every seed, and
their values from ``rng``, fresh at each.

A case's structure is everything but its float values: shapes, lengths, windows, chunk schedules,
block tables, positions, masks, which corners appear (Tq > Tk, a fully masked row, a wrapped
buffer, an empty split). Drawn from the check's id alone, it is the same for every learner and
every grading, so no known mistake can be caught at one seed and missed at another because the
draw left out the case that shows it. Only the values change with the seed: a file tuned to one
grading's numbers fails the next.

``signature`` reads that structure back from what a check sends the learner's code, so that a
test can see it held at every seed (graders/authoring/cases.py).
"""
from __future__ import annotations

import hashlib
import io
import zlib

import numpy as np

CASES = 0x6B617461   # "kata": case_rng's second seed word, after the check's crc (a run's values take
                     # its seed first), so no seed of a run draws a check's structure


def case_generator(check_id: str) -> np.random.Generator:
    """The generator of a check's case structure: seeded by the check's id alone."""
    return np.random.default_rng([zlib.crc32(check_id.encode()), CASES])


def value_generator(seed: int, check_id: str) -> Values:
    """The generator of a check's values at ``seed`` (a run's seed, or its hidden seed)."""
    return Values(np.random.default_rng([seed, zlib.crc32(check_id.encode())]))


class Values:
    """A check's ``rng``: float draws only (normal, uniform), fresh at every seed. Integer draws
    (``integers``, ``choice``, ``permutation``, ``shuffle``) decide a case's structure and come
    from ``case_rng``; asking this generator for one is a mistake in the grader, said at once."""

    def __init__(self, generator: np.random.Generator):
        self._generator = generator

    def standard_normal(self, size=None, dtype=np.float64):
        return self._generator.standard_normal(size, dtype)

    def normal(self, loc=0.0, scale=1.0, size=None):
        return self._generator.normal(loc, scale, size)

    def uniform(self, low=0.0, high=1.0, size=None):
        return self._generator.uniform(low, high, size)

    def random(self, size=None, dtype=np.float64):
        return self._generator.random(size, dtype)

    def __getattr__(self, name):
        raise AttributeError(f"rng.{name}: a check's rng draws its values only (standard_normal, normal, "
                             f"uniform, random); draw shapes, lengths and choices from case_rng, which is the "
                             f"same at every seed")


# --- the structure of what a check sends the learner's code ------------------------------------

def signature(header: dict, blobs: list) -> list:
    """The structure of one request to the learner's code (learner.Learner's wire format): what
    is asked (op, target, argument names), every int, bool and string, and each array's dtype and
    shape; an integer or boolean array whole (positions, lengths, masks), a float array by where it
    holds inf, NaN or 0 (a masked row, a padding). Float values, the run's seed, the numbers of the
    sandbox's objects (which count every object made before, in any check) and the reply are left
    out."""
    target = header.get("target")
    target = [None if target[0] is None else "object", target[1]] if isinstance(target, list) and len(target) == 2 \
        else target
    return [header.get("op"), _structure(target, blobs), _structure(header.get("args"), blobs),
            _structure(header.get("kwargs"), blobs), header.get("repeats"), bool(header.get("record")),
            bool(header.get("echo")), bool(header.get("discard"))]


def _structure(value, blobs):
    if value is None or type(value) in (bool, int, str):
        return value
    if isinstance(value, list):
        return [_structure(v, blobs) for v in value]
    if not isinstance(value, dict):
        return type(value).__name__
    if "float" in value:
        return "float"
    if "handle" in value:
        return "object"
    if "ndarray" in value or "npscalar" in value:
        return _array_structure(blobs[value.get("ndarray", value.get("npscalar"))])
    if "tensor" in value:
        data = None if value["tensor"] is None else _array_structure(blobs[value["tensor"]])
        return ["tensor", *(value.get(k) for k in ("dtype", "shape", "permute", "requires_grad")), data]
    return {k: _structure(v, blobs) for k, v in sorted(value.items())}


def _array_structure(blob) -> list:
    array = np.load(io.BytesIO(blob), allow_pickle=False)
    if array.dtype.kind in "biu":
        shown = array
    else:   # floats and complex: where the values are special, not what they are
        shown = np.stack([np.isposinf(array.real), np.isneginf(array.real), np.isnan(array), array == 0])
    return [str(array.dtype), list(array.shape), hashlib.sha256(np.ascontiguousarray(shown).tobytes()).hexdigest()[:16]]
