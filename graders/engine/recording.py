"""Recorded oracle values: how a student bundle grades without the reference.

Every value a grader takes from the reference, a bug oracle or the expected values kept beside
them comes from one call through ``Book.call``: an oracle entry (``bugs.reference.softmax(x,
axis=1)``, ``bugs.expected.band(6, 9, 3)``) or a grader helper marked ``@recorded`` that is given
oracle entries (``trusted(impl.MultiHeadSelfAttention, sd, H, x)``).
Its key is a hash of what was called and of its arguments, canonicalised (arrays and tensors by
dtype, shape and bytes; dicts, lists, numbers, strings). Graders build those arguments from their
seeded RNG only, never from the learner's output, so the same call comes back in a bundle at the
same seed. In the full kit a Book computes (and, while `kata release` builds a bundle, records);
in a bundle it looks values up. Stored as JSON plus ``.npy`` arrays in an ``.npz``, read with
``allow_pickle=False``.
"""
from __future__ import annotations

import functools
import hashlib
import io
import json
import zipfile
from pathlib import Path

import numpy as np

from .failures import SandboxFailed
from .tape import spread

FORMAT = 1


class NotRecorded(SandboxFailed):
    """A bundle was asked for an oracle value it did not record: the check cannot judge (status error)."""


class OracleRaised(Exception):
    """In a bundle: the oracle call raised this exception type when it was recorded."""


class Entry:
    """``impl.name`` of an oracle: call it, or hand it to a ``@recorded`` helper."""

    def __init__(self, oracle, name: str):
        self.oracle, self.name = oracle, name

    def resolve(self):
        return getattr(self.oracle.namespace, self.name)

    def __call__(self, *args, **kwargs):
        return self.oracle.book.call(("entry", self.oracle.name, self.name), args, kwargs,
                                     lambda: self.resolve()(*args, **kwargs), what=f"{self.oracle.name}.{self.name}")

    def __repr__(self):
        return f"<{self.oracle.name}.{self.name}>"


class Oracle:
    """One implementation, the reference or a bug: ``namespace`` is None in a bundle."""

    def __init__(self, book: Book, name: str, namespace):
        self.book, self.name, self.namespace = book, name, namespace

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Entry(self, name)


def recorded(helper):
    """A grader helper whose result depends only on its arguments, one of which is an oracle
    entry: called through that entry's Book, with the entries resolved to the real objects.
    Given no entry (a test handing it a class itself), it is a plain call."""

    @functools.wraps(helper)
    def wrapper(*args, **kwargs):
        entries = [a for a in [*args, *kwargs.values()] if isinstance(a, Entry)]
        if not entries:
            return helper(*args, **kwargs)
        real = lambda a: a.resolve() if isinstance(a, Entry) else a
        return entries[0].oracle.book.call(
            ("helper", helper.__module__, helper.__qualname__), args, kwargs,
            lambda: helper(*map(real, args), **{k: real(v) for k, v in kwargs.items()}),
            what=f"{helper.__qualname__}({', '.join(map(repr, entries))}, ...)")

    return wrapper


class Book:
    """Where oracle values come from: computed (and put in ``record`` when given), or looked up in
    ``replay`` (a bundle)."""

    def __init__(self, *, record: Store | None = None, replay: Store | None = None, memo: str | None = None):
        self.record, self.replay = record, replay
        self.muted = False   # set while a hidden check runs: a bundle never holds its values
        self._depth = 0   # calls inside a helper being computed are its business, not recorded
        self.memo = memo   # a kata's name: keep its computed values for the process (see MEMO)

    @property
    def replaying(self) -> bool:
        return self.replay is not None

    def call(self, ident, args, kwargs, compute, *, what: str):
        if self.replay is not None:
            value = self.replay.get(key(ident, args, kwargs))
            if value is _MISSING:
                raise NotRecorded(f"The student bundle has no recorded value of {what} for this input, so this "
                                  "check cannot be judged here. It is graded in full when your instructor grades.")
            if isinstance(value, OracleRaised):
                raise value
            return value
        if self.memo and not self._depth and self.record is None:
            return _memoized((self.memo, ident), args, kwargs, compute)
        if self._depth or self.record is None or self.muted:
            return compute()
        k = key(ident, args, kwargs)
        self._depth += 1
        try:
            value = compute()
        except Exception as exc:
            self.record.put(k, OracleRaised(type(exc).__name__))
            raise
        finally:
            self._depth -= 1
        self.record.put(k, value)
        return value


_MISSING = object()

# Oracle values computed in this process, for the katas whose oracles are slow to compute (a Triton
# kata's kernels run on the interpreter): {key: value}, the oldest dropped past MEMO_SIZE. A grading
# asks the reference for what a failed check compares against again, and every bug in turn for its
# diagnosis; the suite's gradings of a kata's bugs (deep.regrade, at one seed) ask for the same ones
# again. Values are handed out as copies, since a grader may change what it is given.
MEMO: dict[str, object] = {}
MEMO_SIZE = 512


def _memoized(ident, args, kwargs, compute):
    import copy

    k = key(ident, args, kwargs)
    if k not in MEMO:
        try:
            value = compute()
        except Exception as exc:
            MEMO[k] = exc
            raise
        MEMO[k] = value
        if len(MEMO) > MEMO_SIZE:
            del MEMO[next(iter(MEMO))]
    value = MEMO[k]
    if isinstance(value, Exception):
        raise value
    return copy.deepcopy(value)


# --- keys -----------------------------------------------------------------------------------

def key(ident, args, kwargs) -> str:
    digest = hashlib.sha256()
    _feed(digest, (ident, tuple(args), dict(kwargs)))
    return digest.hexdigest()


def _feed(h, value):
    kind = type(value)
    if value is None or kind in (bool, int, str):
        h.update(f"{kind.__name__}:{value!r};".encode())
    elif kind is float:
        h.update(f"float:{value.hex()};".encode())
    elif kind in (tuple, list):
        h.update(f"{kind.__name__}[{len(value)}:".encode())
        for v in value:
            _feed(h, v)
        h.update(b"]")
    elif kind is dict:
        h.update(f"dict[{len(value)}:".encode())
        for k in sorted(value):
            _feed(h, k)
            _feed(h, value[k])
        h.update(b"]")
    elif isinstance(value, Entry):
        h.update(f"entry:{value.oracle.name}.{value.name};".encode())
    elif isinstance(value, (np.ndarray, np.generic)):
        a = np.ascontiguousarray(value)
        h.update(f"ndarray:{a.dtype.str}{a.shape}:".encode())
        h.update(a.tobytes())
    elif _torch_kind(value) == "tensor":
        import torch

        t = value.detach()
        # Values, not placement: a bundle may grade on CUDA what was recorded on the CPU. A view's
        # layout is part of it (a kernel that assumes the row length reads a slice's gaps).
        h.update(f"tensor:{t.dtype}{tuple(t.shape)}:{t.device.type == 'meta'}:".encode())
        if t.device.type != "meta":
            t, form = spread(t)
            h.update(f"{form}:".encode())
            narrow = t.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)   # not in NumPy: their bits
            h.update((t.view(torch.int16 if t.element_size() == 2 else torch.uint8) if narrow else t).numpy().tobytes())
    elif _torch_kind(value) in ("dtype", "device"):
        h.update(f"{_torch_kind(value)}:{value};".encode())
    else:
        raise TypeError(f"cannot key an oracle call on a {kind.__qualname__}: pass arrays, tensors, numbers or strings")


def _torch_kind(value) -> str | None:
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if isinstance(value, torch.Tensor):
        return "tensor"
    if isinstance(value, torch.dtype):
        return "dtype"
    if isinstance(value, torch.device):
        return "device"
    return None


# --- storage: JSON for the structure, .npy inside an .npz for the arrays --------------------

class Store:
    """Recorded values by key, kept encoded (arrays copied in and out, so no caller can change one)."""

    def __init__(self, values: dict | None = None, arrays: list | None = None):
        self.values, self.arrays = values or {}, arrays or []

    def __len__(self):
        return len(self.values)

    def put(self, k: str, value):
        self.values[k] = _encode(value, self.arrays)

    def get(self, k: str):
        return _decode(self.values[k], self.arrays) if k in self.values else _MISSING

    def save(self, info: dict, json_path: Path, npz_path: Path):
        json_path.write_text(json.dumps({"format": FORMAT, **info, "values": self.values}), encoding="utf-8")
        with zipfile.ZipFile(npz_path, "w", zipfile.ZIP_DEFLATED) as z:
            for i, a in enumerate(self.arrays):
                buffer = io.BytesIO()
                np.save(buffer, a, allow_pickle=False)
                z.writestr(f"a{i}.npy", buffer.getvalue())

    @classmethod
    def load(cls, json_path: Path, npz_path: Path) -> tuple[dict, Store]:
        """(info, store) of one kata's recording."""
        data = json.loads(json_path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT:
            raise ValueError(f"{json_path}: recording format {data.get('format')!r}; this kit reads {FORMAT}")
        with np.load(npz_path, allow_pickle=False) as npz:
            arrays = [npz[f"a{i}"] for i in range(len(npz.files))]
        return data, cls(data.pop("values"), arrays)


def _encode(value, arrays):
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is float:
        return {"float": value.hex()}
    if type(value) in (tuple, list):
        return {type(value).__name__: [_encode(v, arrays) for v in value]}
    if isinstance(value, OracleRaised):
        return {"raised": str(value)}
    if isinstance(value, (np.ndarray, np.generic)):
        arrays.append(np.array(value))
        return {"ndarray" if isinstance(value, np.ndarray) else "npscalar": len(arrays) - 1}
    if _torch_kind(value) == "tensor":
        import torch

        t = value.detach()
        entry = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "meta": t.device.type == "meta"}
        if not entry["meta"]:
            t = t.cpu()
            narrow = t.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)   # float32 holds them exactly
            arrays.append((t.float() if narrow else t).numpy().copy())
            entry["data"] = len(arrays) - 1
        return {"tensor": entry}
    raise TypeError(f"cannot record an oracle value of type {type(value).__qualname__}")


def _decode(value, arrays):
    if value is None or type(value) in (bool, int, str):
        return value
    (tag, inner), = value.items()
    if tag == "float":
        return float.fromhex(inner)
    if tag in ("tuple", "list"):
        items = [_decode(v, arrays) for v in inner]
        return tuple(items) if tag == "tuple" else items
    if tag == "raised":
        return OracleRaised(inner)
    if tag == "npscalar":
        return arrays[inner][()]
    if tag == "ndarray":
        return np.array(arrays[inner])
    if tag == "tensor":
        import torch

        dtype = getattr(torch, inner["dtype"])
        if inner["meta"]:
            return torch.empty(inner["shape"], dtype=dtype, device="meta")
        return torch.from_numpy(np.array(arrays[inner["data"]])).to(dtype)
    raise ValueError(f"unknown recorded value tag {tag!r}")
