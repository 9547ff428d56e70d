"""Judgements graders make about values that came back from the sandbox.

Order matters and is always the same: exact type, then shape, then dtype (and device), then
values. Each failure raises CheckFailed with the call, the case, what came back and what was
expected; ``diagnose`` (called only on failure) names the known bug the output matches.
"""
from __future__ import annotations

import re
from typing import Callable

import numpy as np

from .failures import CheckFailed, LearnerRaised, sentence
from .learner import Foreign, Remote, describe_value
from .recording import NotRecorded

Diagnose = Callable[[], "str | None"] | None

# Notes of the check that is running: {code: sentence}. A note tells a learner something about
# code that passed (it computes in float32 inside, it answered a float); the plugin clears them
# before each check and attaches them to its report.
NOTES: dict[str, str] = {}


def note(code: str, sentence: str):
    NOTES.setdefault(code, sentence)


def length(learner, obj, *, name: str) -> int:
    """len(obj) of a sandbox object, which the learner knows as ``name``. The proxy reaches methods
    by name and refuses dunder calls, so this calls the object's bound __len__; a failure reads
    as the call the learner wrote, len(name), and the answer must be an int."""
    call, cls = f"len({name})", obj.type_name.rsplit(".", 1)[-1]
    method = learner.get(obj, "__len__")
    that(isinstance(method, Remote), f"{cls}.__len__ must be a method: {call} calls it.", call=call,
         got=f"{cls}.__len__ = {describe_value(method)}", expected="def __len__(self)")
    label = method.type_name.rsplit(".", 1)[-1]   # the bound method's type, the proxy's label for it
    try:
        n = method()
    except CheckFailed as exc:
        exc.message = re.sub(rf"^{re.escape(label)}(\(\))?", call, exc.message)
        exc.call = call
        raise
    that(type(n) is int, f"{call} must be an int, the number of tokens it holds.", call=call,
         got=describe_value(n), expected="int")
    return n


def magnitude(*values) -> float:
    """The largest finite |value| among arrays or tensors: the scale a tolerance grows with."""
    biggest = 0.0
    for value in values:
        a = np.abs(as_float64(value))
        a = a[np.isfinite(a)]
        if a.size:
            biggest = max(biggest, float(a.max()))
    return biggest


def _is_tensor(value) -> bool:
    return type(value).__module__ == "torch" and type(value).__name__ == "Tensor"


def _diagnosis(diagnose: Diagnose) -> str | None:
    try:
        return diagnose() if diagnose is not None else None
    except NotRecorded:   # a student bundle without this oracle value: no diagnosis, the failure stands
        return None


def fail(message: str, *, diagnose: Diagnose = None, **fields):
    raise CheckFailed(message, diagnosis=_diagnosis(diagnose), **fields)


def that(condition: bool, message: str, *, diagnose: Diagnose = None, **fields):
    if not condition:
        fail(message, diagnose=diagnose, **fields)


FLOAT_MASK = ("Masks must be bool tensors (True = may attend). A float mask means something else to "
              "F.scaled_dot_product_attention: it is added to the scores, so a 0/1 float mask hides nothing.")


def bool_mask(got, shape: tuple, *, call: str, case: str | None = None, device: str | None = None,
              what: str = "the result"):
    """A mask must be a plain bool tensor of ``shape`` (and on ``device``) before its values count."""
    import torch

    type_of(got, torch.Tensor, call=call, case=case, what=what)
    that(tuple(got.shape) == shape, "The mask has the wrong shape.", call=call, case=case,
         got=f"shape {tuple(got.shape)}", expected=f"shape {shape}")
    that(got.dtype == torch.bool, FLOAT_MASK, call=call, case=case, got=str(got.dtype), expected="torch.bool")
    if device is not None:
        that(got.device.type == device, "The mask is on the wrong device.", call=call, case=case,
             got=str(got.device), expected=device)


def refused(make: Callable, *, call: str, case: str | None = None, expected: str, raised: str, returned: str,
            naming=(), unnamed: str = "", diagnose: Diagnose = None):
    """``make()`` refuses a bad argument up front: it raises ValueError or AssertionError, whose
    message names each number of ``naming`` (else the failure ``unnamed``). A name the learner's
    file lacks propagates as it is; another exception fails with ``raised``, a return with ``returned``."""
    try:
        result = make()
    except LearnerRaised as exc:
        if exc.type_name is None:   # the function or class itself is missing: report that as it is
            raise
        said = learner_said(exc)
        got = f"{exc.type_name}: {said}" if said else f"{exc.type_name} with no message"
        that(exc.type_name in ("ValueError", "AssertionError"), raised, call=call, case=case, got=got,
             expected=expected, diagnose=diagnose)
        missing = [n for n in naming if not re.search(rf"(?<![\d.]){n}(?!\.?\d)", said)]
        that(not missing, unnamed, call=call, case=case, got=got, expected=expected)
        return
    fail(returned, call=call, case=case, got=describe_value(result), expected=expected, diagnose=diagnose)


def learner_said(exc: LearnerRaised) -> str:
    """The learner's own exception message: without the call in front or the lines of code after."""
    first, *rest = exc.message.splitlines()
    lines = [first.partition(f" raised {exc.type_name}")[2].removeprefix(": ")]
    return "\n".join(lines + [line for line in rest if not line.startswith("  line ")]).strip()


def type_of(got, expected_type: type, *, call: str, case: str | None = None, what: str = "the result"):
    """``type(got) is expected_type``: subclasses and look-alikes are refused."""
    if type(got) is not expected_type:
        name = f"{expected_type.__module__}.{expected_type.__qualname__}".replace("builtins.", "")
        extra = " Return plain values: subclasses and wrapper objects are not accepted." if isinstance(got, Foreign) else ""
        fail(f"{sentence(what)} has the wrong type.{extra}", call=call, case=case,
             got=describe_value(got), expected=name)


def form(got, expected_type: type, shape: tuple, *, call: str, case: str | None = None, dtype=None,
         device: str | None = None, what: str = "the result"):
    """``got`` is a plain ``expected_type`` of ``shape`` (and ``dtype``, and on ``device``, where
    given): what a property check needs of an answer whose values other checks judge."""
    type_of(got, expected_type, call=call, case=case, what=what)
    Name = sentence(what)
    that(tuple(got.shape) == tuple(shape), f"{Name} has the wrong shape.", call=call, case=case,
         got=f"shape {tuple(got.shape)}", expected=f"shape {tuple(shape)}")
    that(dtype is None or got.dtype == dtype, f"{Name} has the wrong dtype.", call=call, case=case,
         got=str(got.dtype), expected=str(dtype))
    that(device is None or got.device.type == device, f"{Name} is on the wrong device.", call=call, case=case,
         got=str(getattr(got, "device", "")), expected=str(device))


def array(got, expected, *, call: str, case: str | None = None, rtol: float, atol: float,
          diagnose: Diagnose = None, device: str | None = None, what: str = "the result",
          against: str = "the reference", float32_inside: dict | None = None,
          axes: tuple[str, ...] | None = None):
    """``got`` equals ``expected`` (a NumPy array or torch tensor) in type, shape, dtype, values;
    ``axes`` names its axes for a failure's ``where`` line (see ``values``)."""
    type_of(got, type(expected), call=call, case=case, what=what)
    Name = sentence(what)
    if tuple(got.shape) != tuple(expected.shape):
        fail(f"{Name} has the wrong shape.", call=call, case=case, diagnose=diagnose,
             got=f"shape {tuple(got.shape)}", expected=f"shape {tuple(expected.shape)}")
    if got.dtype != expected.dtype:
        fail(f"{Name} has the wrong dtype.", call=call, case=case, diagnose=diagnose,
             got=str(got.dtype), expected=str(expected.dtype))
    if device is not None and _is_tensor(got) and got.device.type != device:
        fail(f"{Name} is on the wrong device.", call=call, case=case, diagnose=diagnose,
             got=str(got.device), expected=device)
    if _is_tensor(got) and (got.device.type == "meta") != (expected.device.type == "meta"):
        fail(f"{Name} is on the wrong device.", call=call, case=case, diagnose=diagnose,
             got=str(got.device), expected=str(expected.device))
    if _is_tensor(got) and got.device.type == "meta":
        return   # meta tensors have a shape and a dtype, and no values
    values(got, expected, call=call, case=case, rtol=rtol, atol=atol, diagnose=diagnose, what=what,
           against=against, float32_inside=float32_inside, axes=axes)


def as_float64(value) -> np.ndarray:
    if _is_tensor(value):
        return value.detach().to("cpu").double().numpy()
    return np.asarray(value, dtype=np.float64)


def mismatch(got, expected, *, rtol: float, atol: float) -> str | None:
    """None when close (NaN matches NaN, ±inf matches itself); else a sentence saying how far off."""
    g, e = as_float64(got), as_float64(expected)
    bad_nan = np.isnan(g) & ~np.isnan(e)
    if bad_nan.any():
        return f"{int(bad_nan.sum())} of {g.size} values are NaN where finite values were expected " \
               f"(first at {_index(np.argwhere(bad_nan)[0])})"
    bad_inf = np.isinf(g) & ~np.isinf(e)
    if bad_inf.any():
        return f"{int(bad_inf.sum())} of {g.size} values are infinite (first at {_index(np.argwhere(bad_inf)[0])})"
    close = np.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
    if close.all():
        return None
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.where(close, 0.0, np.abs(g - e))
        rel = np.where(close, 0.0, err / np.abs(e))
    # A NaN expected where a number came back is as wrong as it gets (and nanargmax refuses all-NaN).
    worst = np.unravel_index(np.argmax(np.where(np.isnan(err), np.inf, err)), err.shape)
    relative = rel[~np.isnan(rel)]   # none where every differing value is NaN against a number
    whole_g, whole_e = _integral(got), _integral(expected)
    return (f"{int((~close).sum())} of {g.size} values differ (rtol {rtol:g}, atol {atol:g}); "
            f"max abs error {_number(err[worst], whole_g and whole_e, 3)} at {_index(worst)} "
            f"(got {_number(g[worst], whole_g)}, expected {_number(e[worst], whole_e)})"
            + (f", max rel error {relative.max():.3g}" if relative.size else ""))


def _integral(value) -> bool:
    """An integer or bool array, tensor or number: its values print as integers."""
    if _is_tensor(value):
        return not (value.dtype.is_floating_point or value.dtype.is_complex)
    return np.asarray(value).dtype.kind in "biu"


def _number(x, integral: bool, digits: int = 6) -> str:
    """One value of a message: every digit of an integer (an id of 123456789 is not 1.23457e+08)."""
    return str(int(x)) if integral else f"{x:.{digits}g}"


def _shown(value) -> np.ndarray:
    """The values as a message prints them: integers for integer and bool values (a mask's 0s
    and 1s, document ids), float64 otherwise."""
    if not _integral(value):
        return as_float64(value)
    if _is_tensor(value):
        value = value.detach().to("cpu").long().numpy()
    return np.asarray(value).astype(np.int64)


FLOAT32_INSIDE = "float32-inside"


def float32_inside(kata, dtype="float64") -> dict | None:
    """The float32 tolerance a float64 check about semantics also accepts (the ``float32_inside``
    of ``values`` and ``array``), from the kata's manifest. None for other dtypes: float32 inputs
    have that tolerance already."""
    return kata.tolerance("float32") if str(dtype).removeprefix("torch.") == "float64" else None


def values(got, expected, *, call: str, case: str | None = None, rtol: float, atol: float,
           diagnose: Diagnose = None, what: str = "the result", against: str = "the reference",
           float32_inside: dict | None = None, axes: tuple[str, ...] | None = None):
    """``got`` is close to ``expected``. ``float32_inside``: the float32 tolerance (rtol, atol) of
    a check about semantics, not precision. Code that computes in float32 and casts back (Llama's
    ``F.softmax(scores.float(), -1).type_as(q)``) is right up to float32 rounding: it passes
    within that tolerance, with a note. ``axes``: the axes' names, singular and in order
    (``("batch", "head", "position", "channel")``), for the failure's ``where`` line."""
    problem = mismatch(got, expected, rtol=rtol, atol=atol)
    if problem is not None and float32_inside is not None and mismatch(got, expected, **float32_inside) is None:
        worst = problem.rsplit("; ", 1)[-1]   # "max abs error ... at ..., max rel error ..."
        note(FLOAT32_INSIDE, f"Your code computes in float32 inside: {what} and {against} agree to float32 "
                             f"rounding only ({worst}), which this check accepts.")
        return
    if problem is not None:
        wrong = ~np.isclose(as_float64(got), as_float64(expected), rtol=rtol, atol=atol, equal_nan=True)
        first = np.argwhere(wrong)[0] if wrong.any() else np.zeros(wrong.ndim, int)
        g, e = _shown(got), _shown(expected)
        if _integral(got) and _integral(expected) and g.shape == e.shape and g.ndim == 2 and max(g.shape) <= GRID:
            shown_g, shown_e = _grids(g, e)
        else:
            shown_g, shown_e = _excerpt(g, first), _excerpt(e, first)
        fail(f"Values of {what} differ from {against}: {problem}.", call=call, case=case, diagnose=diagnose,
             where=_where(wrong, axes), got=f"{describe_value(got)}{shown_g}",
             expected=f"{describe_value(expected)}{shown_e}")


WINDOW = 8   # values of a row shown, from a few before the first wrong one
GRID = 16    # an integer matrix up to GRID x GRID is drawn whole, as one draws it on a whiteboard
RUNS = 3     # an axis whose differing indices make more runs than this is left out of the where line


def _excerpt(a: np.ndarray, first) -> str:
    """The values of the row (last axis) about the first wrong value, ``first``: e.g. ``; row [0,
    1, 18:26] = [… 0.1 0.2 …]``, the same window of got and expected, so the two lines show where
    they part; a short row whole (``row [0, 1, :]``)."""
    if a.ndim == 0:
        return f" = {_number(a.item(), a.dtype.kind == 'i')}"
    row, n = a[tuple(first[:-1])], a.shape[-1]
    start = max(0, min(int(first[-1]) - 3, n - WINDOW))
    stop = min(n, start + WINDOW)
    text = np.array2string(row[start:stop], precision=4, separator=" ", max_line_width=10_000)[1:-1]
    index = "".join(f"{int(i)}, " for i in first[:-1])
    cut = f"{start or ''}:{stop if stop < n else ''}"
    return f"; row [{index}{cut}] = [{'… ' * (start > 0)}{text}{' …' * (stop < n)}]"


def _grids(g: np.ndarray, e: np.ndarray) -> tuple[str, str]:
    """Two small integer matrices drawn as grids, one line a row, columns aligned across both."""
    width = max(len(str(v)) for v in (*g.flat, *e.flat))
    return tuple(":" + "".join("\n    " + " ".join(f"{v:>{width}}" for v in row) for row in a) for a in (g, e))


def _where(wrong: np.ndarray, axes: tuple[str, ...] | None) -> str | None:
    """Which indices of each axis hold the differing values, for each axis where some do and some
    do not, in a few runs: "heads 1 and 2 (of 4) differ, 0 and 3 match", or unnamed "indices 1
    and 2 of axis 1 (of 4) differ, 0 and 3 match". None where no axis parts them so, or where one
    value differs: the message's "at [i, j]" says where that is."""
    if wrong.sum() < 2:
        return None
    said = []
    for k, n in enumerate(wrong.shape):
        differ = wrong.any(axis=tuple(i for i in range(wrong.ndim) if i != k))
        bad, good = _runs(np.flatnonzero(differ)), _runs(np.flatnonzero(~differ))
        if not bad or not good or len(bad) > RUNS:
            continue
        many = len(bad) > 1 or bad[0][1] > bad[0][0]
        name = axes[k] if axes and k < len(axes) else None
        if name:
            which = f"{_plural(name) if many else name} {_listed(bad)} (of {n})"
        else:
            which = f"{'indices' if many else 'index'} {_listed(bad)} of axis {k} (of {n})"
        matches = "match" if len(good) > 1 or good[0][1] > good[0][0] else "matches"
        said.append(f"{which} {'differ' if many else 'differs'}, {_listed(good)} {matches}")
    return "; ".join(said) or None


def _runs(indices: np.ndarray) -> list[tuple[int, int]]:
    """Sorted indices as runs of consecutive ones, (first, last): [1, 2, 5] -> [(1, 2), (5, 5)]."""
    runs = []
    for i in map(int, indices):
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def _listed(runs: list[tuple[int, int]]) -> str:
    """Runs in words: "0 and 3", "5–7", "0, 2 and 4–7"."""
    items = [str(i) for a, b in runs for i in ((a, b) if b == a + 1 else (a,) if a == b else (f"{a}–{b}",))]
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _plural(name: str) -> str:
    """An axis's name in the plural: head -> heads, batch -> batches, query -> queries."""
    if name.endswith(("s", "x", "ch", "sh")):
        return name + "es"
    if name.endswith("y") and name[-2:-1] not in "aeiou":
        return name[:-1] + "ies"
    return name + "s"


def _index(index) -> str:
    return "[" + ", ".join(str(int(i)) for i in index) + "]"


def same(a, b, *, rtol: float, atol: float) -> bool:
    """Loose structural equality for matching outputs against bug oracles (ints exactly)."""
    if type(a) is int and type(b) is int:
        return a == b
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same(x, y, rtol=rtol, atol=atol) for x, y in zip(a, b))
    if isinstance(a, (np.ndarray, np.generic, float, int)) or _is_tensor(a):
        if not (isinstance(b, (np.ndarray, np.generic, float, int)) or _is_tensor(b)):
            return False
        if tuple(np.shape(a)) != tuple(np.shape(b)):
            return False
        if (_is_tensor(a) and a.device.type == "meta") or (_is_tensor(b) and b.device.type == "meta"):
            return _is_tensor(a) and _is_tensor(b) and a.device == b.device and a.dtype == b.dtype
        return mismatch(a, b, rtol=rtol, atol=atol) is None
    return a == b if type(a) is type(b) else False
