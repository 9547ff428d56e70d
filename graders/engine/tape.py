"""The calls a check makes into the learner's code, kept so that a failed public check can be made
again outside the kit (`kata repro`, graders/practice/repro.py).

While a check runs, its learner proxy (and each rank's, in a rank group) writes every call it sends
to the sandbox on the ``Tape``: the function or method, copies of the arguments, and what came back.
A check that fails leaves its tape to the runner, which ``save``s the tapes of the failed public
checks beside the workspace's state; hidden checks never keep theirs. ``load`` reads one back, and
``Learner.replay`` makes its calls again on another file (the reference's), for what each should
return.

Saved, a tape is ``<check>.json`` (the calls, arguments written as tagged values) and
``<check>.npz`` (every array and tensor, by name), read back with ``allow_pickle=False``.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

INDEX = "index.json"


@dataclass
class Step:
    """One call into the learner's code: ``target(*args, **kwargs)``, where ``handle`` is None for a
    name of the file (``path`` = [name]) or the object an earlier step returned (``path`` its
    attribute path, ["__call__"] for the object itself); on ``rank`` of a rank group, or None."""
    rank: int | None
    handle: int | None
    path: list[str]
    args: list
    kwargs: dict
    got: object = None          # the value that came back (a Handle for a sandbox object)
    raised: str | None = None   # the exception's type name, where the call raised
    get: bool = False           # not a call: the attribute ``path`` of the object read


@dataclass(frozen=True)
class Handle:
    """A sandbox object in a tape: the ``id`` the sandbox gave it, of class ``type_name``."""
    id: int
    type_name: str


@dataclass
class Tape:
    """The calls of a grading; those of the check that runs from ``start`` on (a check may use an
    object an earlier one made: a module built once for several checks)."""
    steps: list[Step] = field(default_factory=list)
    start: int = 0
    paused: bool = False   # a hidden check runs: its calls are never kept
    given: str | None = None   # the kit's source the calls' file ran with, after its own (Learner.appended)

    def begin(self, hidden: bool):
        """A check begins: its calls are the ones from here on."""
        self.start, self.paused, self.given = len(self.steps), hidden, None

    def excerpt(self) -> "Tape":
        """The running check's calls, after the earlier calls they need (``needed``)."""
        own = range(self.start, len(self.steps))
        earlier = [i for i in needed(self.steps, own) if i < self.start] if own else []
        return Tape([self.steps[i] for i in earlier] + self.steps[self.start:], len(earlier), given=self.given)


def _objects(step: Step) -> set[tuple]:
    """The sandbox objects a step uses, as (rank, handle): its target and its arguments."""
    used = {(step.rank, v.id) for v in leaves([step.args, step.kwargs]) if isinstance(v, Handle)}
    return used | ({(step.rank, step.handle)} if step.handle is not None else set())


def needed(steps: list[Step], wanted) -> list[int]:
    """The indices of ``wanted`` and of the steps before the last of them that made or used an
    object they use, or one such a step uses: what must run for them to run as they did."""
    chosen = set(wanted)
    last = max(chosen)
    objects = set().union(*(_objects(steps[i]) for i in chosen))
    for i in range(last - 1, -1, -1):   # backwards: a step found needed adds the objects it uses
        step = steps[i]
        made = isinstance(step.got, Handle) and (step.rank, step.got.id) in objects
        if i not in chosen and (made or _objects(step) & objects):
            chosen.add(i)
            objects |= _objects(step)
    return sorted(chosen)


def leaves(value):
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from leaves(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from leaves(v)
    else:
        yield value


# --- on disk ---------------------------------------------------------------------------------------

def save(folder: Path, tapes: dict[str, Tape], meta: dict):
    """Write ``tapes`` ({check id: tape}, in the order the checks failed) and ``meta`` (the kata,
    the file, the seed, each check's name) into ``folder``, replacing what it held."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for cid, tape in tapes.items():
        arrays = {}
        steps = [{"rank": s.rank, "handle": s.handle, "path": s.path, "args": _encode(s.args, arrays),
                  "kwargs": _encode(s.kwargs, arrays), "got": _encode(s.got, arrays), "raised": s.raised,
                  "get": s.get}
                 for s in tape.steps]
        np.savez(folder / f"{cid}.npz", **arrays)
        saved = {"start": tape.start, "given": tape.given, "steps": steps}
        (folder / f"{cid}.json").write_text(json.dumps(saved), encoding="utf-8")
    (folder / INDEX).write_text(json.dumps({**meta, "checks": list(tapes)}), encoding="utf-8")


def index(folder: Path) -> dict | None:
    try:
        return json.loads((folder / INDEX).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def load(folder: Path, cid: str) -> Tape:
    with np.load(folder / f"{cid}.npz", allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    saved = json.loads((folder / f"{cid}.json").read_text(encoding="utf-8"))
    steps = [Step(s["rank"], s["handle"], s["path"], _decode(s["args"], arrays), _decode(s["kwargs"], arrays),
                  _decode(s["got"], arrays), s["raised"], s["get"]) for s in saved["steps"]]
    return Tape(steps, saved["start"], given=saved["given"])


def _encode(value, arrays: dict):
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is float:
        return {"float": repr(value)}
    if isinstance(value, Handle):
        return {"handle": value.id, "type": value.type_name}
    if type(value) in (list, tuple):
        return {type(value).__name__: [_encode(v, arrays) for v in value]}
    if type(value) is dict:
        return {"dict": {str(k): _encode(v, arrays) for k, v in value.items()}}
    if isinstance(value, (np.ndarray, np.generic)):
        name = f"a{len(arrays)}"
        arrays[name] = np.asarray(value)
        return {"ndarray" if isinstance(value, np.ndarray) else "npscalar": name}
    if type(value).__module__ == "torch" and type(value).__name__ in ("Tensor", "Parameter"):
        import torch

        fields = {"dtype": str(value.dtype), "shape": list(value.shape), "requires_grad": value.requires_grad}
        if value.device.type == "meta":
            return {"tensor": None, **fields}
        base, form = spread(value)   # a view keeps its strides
        name = f"a{len(arrays)}"
        narrow = base.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)   # float32 holds them exactly
        arrays[name] = (base.float() if narrow else base).numpy()
        return {"tensor": name, **fields, **form}
    if type(value).__module__ == "torch" and type(value).__name__ in ("dtype", "device"):
        return {f"torch_{type(value).__name__}": str(value)}
    return {"other": type(value).__name__}


def _decode(value, arrays: dict):
    if value is None or type(value) in (bool, int, str):
        return value
    if "float" in value:
        return float(value["float"])
    if "handle" in value:
        return Handle(int(value["handle"]), str(value["type"]))
    if "list" in value:
        return [_decode(v, arrays) for v in value["list"]]
    if "tuple" in value:
        return tuple(_decode(v, arrays) for v in value["tuple"])
    if "dict" in value:
        return {k: _decode(v, arrays) for k, v in value["dict"].items()}
    if "ndarray" in value:
        return arrays[value["ndarray"]]
    if "npscalar" in value:
        return arrays[value["npscalar"]][()]
    import torch

    if "tensor" in value:
        dtype = getattr(torch, value["dtype"].removeprefix("torch."))
        if value["tensor"] is None:
            return torch.empty(value["shape"], dtype=dtype, device="meta")
        t = viewed(torch.from_numpy(arrays[value["tensor"]]).to(dtype), value["shape"], value)
        return t.requires_grad_() if value["requires_grad"] else t
    if "torch_dtype" in value:
        return getattr(torch, value["torch_dtype"].removeprefix("torch."))
    if "torch_device" in value:
        return torch.device(value["torch_device"])
    return Unknown(value.get("other", "?"))


def spread(t, strided: bool = True) -> tuple[object, dict]:
    """How a tensor crosses to another process, its strides kept: (a contiguous CPU tensor, and how
    to view it as ``t``: ``{"permute": order}`` for a permuted view such as x.transpose(1, 2), sent as
    its contiguous base; ``{"strides": strides}`` for a slice of a larger tensor such as x[:, :n],
    sent as the span of storage it covers, the gaps between its rows included). Not ``strided``: a
    slice is sent as a contiguous copy of its values (a Triton kata's kernels are the ones whose
    strides a grader judges; the span of a shard can be all of the tensor it was cut from)."""
    order = layout(t)
    base = t.detach().cpu().permute(order)
    if base.is_contiguous() or not t.numel() or not strided:
        return base.contiguous(), {"permute": [order.index(i) for i in range(t.dim())]}
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.detach().cpu().as_strided((span,), (1,)).contiguous(), {"strides": list(t.stride())}


def viewed(base, shape, form: dict):
    """The view ``spread`` describes, of ``base`` (what it sent)."""
    if form.get("strides"):
        return base.as_strided(shape, form["strides"])
    return base.permute(form["permute"]) if form.get("permute") else base


def layout(t) -> list[int]:
    """The dimension order of ``t`` in memory, outermost first: identity for contiguous tensors."""
    if t.is_contiguous() or t.device.type == "meta":
        return list(range(t.dim()))
    return sorted(range(t.dim()), key=lambda i: (-t.stride(i), i))


@dataclass
class Outcome:
    """What a call made again answered."""
    value: object = None
    raised: str | None = None   # the message, where the call raised
    lost: bool = False          # the call could not be made again (an object no step of the tape made)


@dataclass(frozen=True)
class Unknown:
    """A value a tape cannot keep (neither plain data nor a sandbox object)."""
    type_name: str
