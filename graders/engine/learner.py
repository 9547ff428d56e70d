"""The one way graders reach the learner's code: a proxy over the sandbox.

``learner.softmax(x, axis=1)`` calls the learner's function in the sandbox and returns plain
values: NumPy arrays, torch tensors (rebuilt here from ``.npy`` data, on the device they were on),
Python scalars, lists, tuples and dicts. Anything else (a module instance, say) comes back as a
``Remote`` whose methods can be called the same way. Input tensors are sent to ``learner.device``.

Every reply is untrusted data: it is decoded strictly, arrays are read with ``allow_pickle=False``,
and a value whose type is not plain (a tensor subclass, an object with a lying ``__eq__``) arrives
as a ``Foreign`` placeholder that fails every type check.
"""
from __future__ import annotations

import contextlib
import io
import math
import re
import threading
import time

import numpy as np

from .failures import CheckFailed, LearnerRaised, NotStarted, SandboxFailed, sentence
from .sandbox import LoadError, SandboxError, describe_error
from .tape import Handle, Outcome, Step, layout, spread, viewed

PLAIN_TENSOR_TYPES = ("torch.Tensor", "torch.nn.parameter.Parameter")
OUTPUT_SHOWN = 8192   # characters of a check's printed output kept in its report
MEASURE_MIN_S = 0.05   # what the timed calls of learner.measure take at least, when they can
MEASURE_GROWTH = 64   # the most it multiplies the calls asked for to get there


class Foreign:
    """A value that came back as something other than plain data."""

    def __init__(self, type_name: str, text: str = ""):
        self.type_name, self.text = type_name, text

    def __repr__(self):
        return f"<{self.type_name}>"


class Remote:
    """An object living in the sandbox (e.g. the learner's nn.Module instance)."""

    def __init__(self, learner: Learner, handle: int, type_name: str, label: str):
        self._learner, self._handle, self.type_name, self._label = learner, handle, type_name, label

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Member(self._learner, self._handle, [name], f"{self._label}.{name}")

    def __call__(self, *args, **kwargs):
        return self._learner._call((self._handle, ["__call__"]), args, kwargs, self._label)

    def __repr__(self):
        return f"<{self.type_name} in the sandbox>"


class _Member:
    def __init__(self, learner, handle, path, label):
        self._learner, self._handle, self._path, self._label = learner, handle, path, label

    def __call__(self, *args, **kwargs):
        return self._learner._call((self._handle, self._path), args, kwargs, self._label)

    def echo(self, *args, **kwargs):
        """Call, and also return the arguments as the call left them: ``(result, args, kwargs)``."""
        return self._learner._call((self._handle, self._path), args, kwargs, self._label, echo=True)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Member(self._learner, self._handle, [*self._path, name], f"{self._label}.{name}")


class Learner:
    """Proxy for the learner's module. Used by graders through the ``learner`` fixture."""

    def __init__(self, sandbox, device: str = "cpu", seed: int = 0, trace=None):
        """``trace``: a hashlib object that takes every value the learner's code answers with
        (how `kata lint --mutants` tells a mutant that computes exactly what the reference does)."""
        self._sandbox, self.device, self.seed, self._trace = sandbox, device, seed, trace
        self._recording = None
        self._printed = []
        self._ranks = {}   # world size -> Ranks
        self.tape, self.rank = None, None   # a tape.Tape that keeps every call (see tape.py); the rank
        self._kit = set()   # handles of the kit's own functions: their calls are not the learner's
        self.custom_operators = set()   # seen in a recording: what their bodies computed was not recorded
        self.below_recorder = set()     # functions of the file that torch ran inside its own calls, unrecorded

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return _Member(self, None, [name], name)

    @property
    def file_name(self) -> str:
        return self._sandbox.file_name

    @property
    def source(self) -> str:
        return self._sandbox.source_text.decode("utf-8", "replace")

    @property
    def framework(self) -> str:
        return self._sandbox.framework

    @property
    def allow(self) -> tuple[str, ...]:
        return self._sandbox.allow

    def names(self) -> list[str]:
        """Public names the learner's file defines (loads it first)."""
        return list(self._load()["names"])

    @contextlib.contextmanager
    def recording(self):
        """Record the torch functions that run inside calls made in this block."""
        ops = []
        self._recording = ops
        try:
            yield ops
        finally:
            self._recording = None

    @contextlib.contextmanager
    def appended(self, source: str):
        """This learner's file run in a second sandbox with the kit's ``source`` loaded after it
        (a given class the file lacks); the source that scans read stays the file as handed in."""
        sandbox = self._sandbox.sibling(source.encode()).start()
        try:
            extended = Learner(sandbox, device=self.device, seed=self.seed, trace=self._trace)
            if self.tape is not None:
                extended.tape, self.tape.given = self.tape, source
            yield extended
        finally:
            sandbox.close()

    @contextlib.contextmanager
    def compiled(self):
        """This learner's file in a second sandbox whose Triton kernels are compiled for the GPU
        (see Sandbox.compiled): a Triton kata's @cuda checks call it with CUDA tensors. Nothing of
        it is recorded: the structure checks judge the interpreted kernels."""
        sandbox = self._sandbox.compiled().start()
        try:
            yield Learner(sandbox, device="cuda", seed=self.seed, trace=self._trace)
        finally:
            sandbox.close()

    def ranks(self, world: int) -> "Ranks":
        """This learner's file run as the ``world`` ranks of one torch.distributed group (see Ranks):
        the same group for the whole grading, closed with the learner's sandbox."""
        if world not in self._ranks:
            self._ranks[world] = Ranks(self, world)
        return self._ranks[world]

    def kit_ranks(self, world: int) -> "Ranks":
        """``world`` ranks like ``ranks(world)``'s that load no file of the learner's (see
        Sandbox.kit_group): a baseline measured there is kit code's alone."""
        if ("kit", world) not in self._ranks:
            self._ranks["kit", world] = Ranks(self, world, kit=True)
        return self._ranks["kit", world]

    def take_output(self) -> str:
        """What the learner's code printed since the last call of this (capped in the sandbox)."""
        text, self._printed = "".join(self._printed), []
        if len(text) > OUTPUT_SHOWN:
            text = text[:OUTPUT_SHOWN] + f"\n… {len(text) - OUTPUT_SHOWN:,} more characters of output were dropped."
        return text

    def measure(self, member, *args, repeats: int = 5, **kwargs) -> dict:
        """Time and memory of ``member(*args, **kwargs)`` in the sandbox, e.g.
        ``learner.measure(model, x)``: {"seconds": per call, "peak_bytes": peak CUDA memory
        above the inputs (None on the CPU)}. Seconds come from this process's clock: a request
        with one warm-up call is subtracted from one with the warm-up and ``repeats`` calls, so
        start-up and a request's own cost cancel out and the learner's code cannot fake its own
        timing; the arguments are kept in the sandbox first, so no timed request carries them.
        Calls so fast that ``repeats`` of them take under MEASURE_MIN_S are repeated more."""
        target = _target(member)
        label = member._label
        what = call_text(label, args, kwargs)
        self._load()   # start-up must not land in the first timing
        # The arguments are sent once, before both timed requests: sending and decoding a large
        # input can take longer than many fast calls, and its jitter would swamp their difference.
        header = {"op": "measure", "target": list(target), "seed": self.seed, **self._kept(args, kwargs, what, label)}

        def timed(n: int):
            started = time.perf_counter()
            result = self._request({**header, "repeats": n}, [], what, label)
            return time.perf_counter() - started, result

        # A request's own cost varies by milliseconds: calls too fast to stand out of it are
        # repeated more (up to MEASURE_GROWTH times more), against the least cost seen.
        cost = timed(0)[0]
        n = repeats
        while True:
            elapsed, result = timed(n)
            if elapsed - cost >= MEASURE_MIN_S or n >= repeats * MEASURE_GROWTH:
                break
            cost = min(cost, timed(0)[0])
            n *= 4
        peak = result.get("peak_bytes") if isinstance(result, dict) else None
        return {"seconds": max(elapsed - cost, 0.0) / n, "peak_bytes": peak if type(peak) is int else None}

    def peak_bytes(self, member, *args, **kwargs) -> int | None:
        """Peak memory of one call ``member(*args, **kwargs)`` in the sandbox, in bytes above what
        the worker held before it, as the kernel counts the worker's resident pages, read from this
        process: the arguments are sent and kept first, the worker's peak is reset, then the call
        runs and its result stays there. Memory held any way counts (tensors, NumPy arrays, Python
        objects), and no code in the worker takes part in the measure. The library code a call
        runs for the first time is paged in, and counted: measure a call whose code ran before.
        On CUDA, whose memory no page count shows, the CUDA allocator's peak (``tensor_peak_bytes``).
        None if it could not be measured."""
        if self.device == "cuda":
            return self.tensor_peak_bytes(member, *args, **kwargs)
        target = _target(member)
        what = call_text(member._label, args, kwargs)
        header = {"op": "call", "target": list(target), "seed": self.seed, "discard": True,
                  **self._kept(args, kwargs, what, member._label)}
        try:
            self._sandbox.reset_peak()
            before = self._sandbox.memory()["peak"]
        except (OSError, KeyError):
            return None
        self._request(header, [], what, member._label)
        try:
            return max(0, self._sandbox.memory()["peak"] - before)
        except (OSError, KeyError):
            return None

    def _kept(self, args, kwargs, what: str, label: str) -> dict:
        """Send ``args`` and ``kwargs`` to be kept in the sandbox; the request fields that pass
        them to a later call as handles, so that no later request carries or decodes them."""
        blobs = []
        header = {"op": "keep", "args": [self._encode(a, blobs) for a in args],
                  "kwargs": {k: self._encode(v, blobs) for k, v in kwargs.items()}}
        kept = self._request(header, blobs, what, label)
        try:
            kept_args, kept_kwargs = kept
            return {"args": [self._encode(a, []) for a in kept_args],
                    "kwargs": {k: self._encode(v, []) for k, v in kept_kwargs.items()}}
        except (TypeError, ValueError, AttributeError):   # the worker answered something else than handles
            raise SandboxFailed("The sandbox sent a malformed value.", call=what) from None

    def resident_bytes(self) -> int | None:
        """The memory the worker holds now (its own pages, anonymous and shared, its tmpfs files and
        pipes: no library's code, no file's cache; see ``Sandbox.memory``), as the kernel counts
        it, read from this process; None on CUDA, whose memory no page count shows, or where it
        could not be read."""
        if self.device == "cuda":
            return None
        self._load()
        try:
            return self._sandbox.memory(held=True)["held"]
        except (OSError, KeyError):
            return None

    def tensor_peak_bytes(self, member, *args, **kwargs) -> int | None:
        """Peak memory of one call ``member(*args, **kwargs)`` (no grad) as the worker tallies it,
        in bytes above what was allocated before it: CUDA's peak on CUDA, on the CPU the largest
        total of live tensors the call created. The learner's code could change that tally: for
        what the learner is shown of their own code (plots), never for a grade (``peak_bytes``).
        None if the sandbox sent no integer."""
        target = _target(member)
        blobs = []
        header = {"op": "peak", "target": list(target), "seed": self.seed, "device": self.device,
                  "args": [self._encode(a, blobs) for a in args],
                  "kwargs": {k: self._encode(v, blobs) for k, v in kwargs.items()}}
        peak = self._request(header, blobs, call_text(member._label, args, kwargs), member._label)
        return peak if type(peak) is int else None

    def kit_function(self, name: str) -> Remote:
        """A handle to one of the worker's KIT_FUNCTIONS (kit code, e.g. an SDPA baseline), to be
        called or measured in the sandbox like the learner's code, never in this process."""
        remote = self._request({"op": "kit", "name": name}, [], f"the kit's {name}")
        if not isinstance(remote, Remote):
            raise SandboxFailed(f"The sandbox sent no handle for the kit's {name}.")
        self._kit.add(remote._handle)
        return Remote(self, remote._handle, remote.type_name, name)

    def get(self, remote: Remote, attribute: str):
        """The value of an attribute of a sandbox object, e.g. ``learner.get(model, "training")``."""
        value = self._request({"op": "getattr", "target": [remote._handle, [attribute]]}, [],
                              f"{remote._label}.{attribute}")
        if self.tape is not None and not self.tape.paused:
            self.tape.steps.append(Step(self.rank, remote._handle, [attribute], [], {}, snapshot(value), get=True))
        return value

    def replay(self, steps: list[Step]) -> list[Outcome]:
        """Make ``steps`` of a tape (tape.py; one rank's, or a single process's) again on this
        learner's file: what each call answers here. An object a step got stands for the one this
        file's code made at the same step, so that later calls on it reach its counterpart."""
        objects: dict[int, Remote] = {}
        outcomes = []

        def resolve(value):
            if isinstance(value, Handle):
                return objects[value.id]
            if isinstance(value, (list, tuple)):
                return type(value)(resolve(v) for v in value)
            if isinstance(value, dict):
                return {k: resolve(v) for k, v in value.items()}
            return value

        for step in steps:
            try:
                if step.get:
                    value = self.get(objects[step.handle], step.path[0])
                else:
                    target = (None if step.handle is None else objects[step.handle]._handle, step.path)
                    value = self._call(target, resolve(step.args), resolve(step.kwargs), ".".join(step.path))
            except KeyError:   # an object no step of the tape made
                outcomes.append(Outcome(lost=True))
                continue
            except CheckFailed as exc:
                outcomes.append(Outcome(raised=exc.message))
                continue
            if isinstance(step.got, Handle) and isinstance(value, Remote):
                objects[step.got.id] = value
            outcomes.append(Outcome(value=value))
        return outcomes

    def module_info(self, remote: Remote) -> dict:
        """Parameters, buffers, state_dict keys and training flag of a sandbox nn.Module."""
        return self._request({"op": "module_info", "target": [remote._handle, []]}, [],
                             f"inspecting {remote._label}")

    # --- the wire --------------------------------------------------------------------------------

    def _load(self):
        try:
            return self._sandbox.ensure_loaded()
        except LoadError as exc:
            raise SandboxFailed(f"Your file could not be loaded: {exc}") from None

    def _call(self, target, args, kwargs, label, echo=False):
        blobs = []
        header = {"op": "call", "target": [target[0], target[1]], "seed": self.seed,
                  "args": [self._encode(a, blobs) for a in args],
                  "kwargs": {k: self._encode(v, blobs) for k, v in kwargs.items()},
                  "record": self._recording is not None, "echo": echo}
        if self.tape is None or self.tape.paused or target[0] in self._kit:
            return self._request(header, blobs, call_text(label, args, kwargs), label, echo=echo)
        strided = self.framework == "triton"   # the tape keeps what the sandbox got (see _encode)
        step = Step(self.rank, target[0], list(target[1]), snapshot(list(args), strided), snapshot(kwargs, strided))
        self.tape.steps.append(step)
        try:
            value = self._request(header, blobs, call_text(label, args, kwargs), label, echo=echo)
        except CheckFailed as exc:
            step.raised = getattr(exc, "type_name", None) or type(exc).__name__
            raise
        step.got = snapshot(value[0] if echo else value)
        return value

    def _request(self, header, blobs, what, label=None, echo=False):
        self._load()
        try:
            reply, reply_blobs = self._sandbox.request(header, blobs, what=what)
        except SandboxError as exc:
            failed = SandboxFailed(sentence(str(exc)), call=what)
            failed.forbidden = exc.forbidden
            raise failed from None
        output = _output(reply)
        self._printed.append(output)
        traced = self._trace is not None and header["op"] in ("call", "getattr")
        if self._recording is not None and isinstance(reply.get("ops"), list):
            ops = [op for op in reply["ops"] if isinstance(op, dict)]
            self._recording.extend(op for op in ops if op.get("kind") != "below")
            self.custom_operators |= _custom_operators(ops)
            self.below_recorder |= {str(op.get("name")) for op in ops if op.get("kind") == "below"}
        if not reply.get("ok"):
            error = reply.get("error") if isinstance(reply.get("error"), dict) else {}
            if traced:
                self._trace.update(f"raised {error.get('type')}".encode())
                traced = False
            name = (label or what).split("(")[0]
            if error.get("missing"):
                raise LearnerRaised(f"Your file has no {name!r} (or it lacks an attribute the call needs): "
                                    f"{error.get('message', '')}", call=what, output=output)
            if error.get("not_implemented"):
                raise NotStarted(f"{name} is not implemented yet (it raises NotImplementedError).",
                                 call=what, output=output)
            raise LearnerRaised(describe_error(error, what), call=what, output=output,
                                type_name=str(error.get("type", "")))
        try:
            value = self._decode(reply.get("value"), reply_blobs)
            if echo:
                args_after, kwargs_after = self._decode(reply["args_after"], reply_blobs)
                if traced:
                    self._trace.update(_fingerprint([value, args_after, kwargs_after]))
                return value, args_after, kwargs_after
            if traced:
                self._trace.update(_fingerprint(value))
            return value
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            self._sandbox.restart()   # a worker that sends malformed values is not trusted again
            raise SandboxFailed(f"The sandbox sent a malformed value ({exc}).", call=what) from None

    def _encode(self, value, blobs):
        if isinstance(value, Remote):
            return {"handle": value._handle}
        if value is None or type(value) in (bool, int, str):
            return value
        if type(value) is float:
            return {"float": repr(value)}
        if type(value) in (list, tuple):
            return {type(value).__name__: [self._encode(v, blobs) for v in value]}
        if type(value) is dict:
            return {"dict": {k: self._encode(v, blobs) for k, v in value.items()}}
        if isinstance(value, np.ndarray):
            return {"ndarray": _npy(value, blobs)}
        if isinstance(value, np.generic):
            return {"npscalar": _npy(np.asarray(value), blobs)}
        import torch

        if isinstance(value, torch.Tensor):
            device = "meta" if value.device.type == "meta" else self.device
            data, form = None, {"permute": layout(value)}
            if value.device.type != "meta":
                # The sandbox rebuilds a view with the same strides (tape.spread): a kernel that
                # assumes the row length of a slice reads the gaps between its rows.
                cpu, form = spread(value, strided=self.framework == "triton")
                narrow = cpu.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)   # not in NumPy
                data = _npy((cpu.float() if narrow else cpu).numpy(), blobs)
            return {"tensor": data, "dtype": str(value.dtype), "device": device, "shape": list(value.shape),
                    "requires_grad": bool(value.requires_grad), **form}
        if isinstance(value, torch.dtype):
            return {"torch_dtype": str(value)}
        if isinstance(value, torch.device):
            return {"torch_device": str(value)}
        raise TypeError(f"cannot send {type(value).__name__} to the sandbox")

    def _decode(self, value, blobs):
        if value is None or type(value) in (bool, int, str):
            return value
        if type(value) is not dict:
            raise ValueError(f"unexpected {type(value).__name__}")
        if "float" in value:
            return float(str(value["float"]))
        if "list" in value:
            return [self._decode(v, blobs) for v in _list(value["list"])]
        if "tuple" in value:
            return tuple(self._decode(v, blobs) for v in _list(value["tuple"]))
        if "dict" in value:
            if not isinstance(value["dict"], dict):
                raise ValueError("bad dict")
            return {str(k): self._decode(v, blobs) for k, v in value["dict"].items()}
        if "ndarray" in value:
            return _array(blobs[value["ndarray"]])
        if "npscalar" in value:
            return _array(blobs[value["npscalar"]])[()]
        if "handle" in value:
            if type(value["handle"]) is not int:
                raise ValueError("bad handle")
            type_name = str(value.get("type", "object"))
            return Remote(self, value["handle"], type_name, type_name.rsplit(".", 1)[-1])
        if "tensor" in value:
            return self._tensor(value, blobs)
        import torch

        if "torch_dtype" in value:
            return _torch_dtype(torch, value["torch_dtype"])
        if "torch_device" in value:
            return torch.device(str(value["torch_device"]))
        raise ValueError(f"unknown value tag {sorted(value)[:3]}")

    def _tensor(self, value, blobs):
        import torch

        type_name = str(value.get("type"))
        if type_name not in PLAIN_TENSOR_TYPES:
            return Foreign(type_name, "a tensor subclass")
        dtype = _torch_dtype(torch, value["dtype"])
        device = torch.device(str(value["device"]))
        shape = [int(s) for s in _list(value["shape"])]
        if value["tensor"] is None:
            if device.type != "meta":
                raise ValueError("tensor without data")
            return torch.empty(shape, dtype=dtype, device="meta")
        array = _array(blobs[value["tensor"]])
        if list(array.shape) != shape:
            raise ValueError("tensor shape does not match its data")
        tensor = torch.from_numpy(array).to(dtype)
        if device.type == "cuda" and torch.cuda.is_available():
            tensor = tensor.to(device)
        return tensor


_COLLECTIVE_FAILED = "/gloo/"   # in the message of every error gloo raises (its source file)
# A collective that some rank never joins fails after this long. On a rank group's sizes (kilobytes
# over a loopback) a collective whose ranks all call it completes in milliseconds: seconds of waiting
# mean a rank is not coming. Computing is timed by the kata's own CPU limit, which joining the group
# keeps too. Once a group's ranks have left one waiting, its learner's mistake is known, and the
# group waits less at later collectives: the same mistake in later checks is reported as surely.
COLLECTIVE_TIMEOUT_S = 3
KNOWN_WAITING_TIMEOUT_S = 0.5


class CollectiveNotJoined(LearnerRaised):
    """A rank waited in a collective that another rank never called (or called another one in its
    place), as the ranks' process groups recorded them: ``rank`` is the one that did not join."""

    def __init__(self, message: str, *, rank: int, **fields):
        super().__init__(message, type_name="RuntimeError", **fields)
        self.rank = rank


class Ranks:
    """The learner's file run as the ``world`` ranks of one torch.distributed group: gloo on the
    CPU, its default process group joined by the kit in each rank before any call (see
    ``sandbox.RankGroup`` for where the ranks run). ``each(fn)`` runs ``fn(rank, learner)`` for
    every rank at once, each in a thread of its own with a Learner of that rank, since a
    collective returns only once every rank has called it."""

    def __init__(self, learner: Learner, world: int, kit: bool = False):
        self.world = world
        self.group = learner._sandbox.kit_group(world) if kit else learner._sandbox.rank_group(world)
        # Only rank 0's answers go into a mutant's trace: the ranks' threads would mix their order;
        # a kit group's are not the learner's.
        self.learners = [Learner(sandbox, device=learner.device, seed=learner.seed,
                                 trace=learner._trace if rank == 0 and not kit else None)
                         for rank, sandbox in enumerate(self.group.ranks)]
        for rank, each in enumerate(self.learners):
            each.tape, each.rank = (None if kit else learner.tape), rank

    def each(self, fn) -> list:
        """``[fn(rank, learner) for each rank]``, run at once. A failure stops the group; the one
        raised is the cause (see ``_run``), and the next ``each`` starts the group afresh."""
        if not self.group.running:
            self.group.start()
            timeout_s = self.group.sandbox.timeout_s
            waits_s = KNOWN_WAITING_TIMEOUT_S if self.group.left_waiting else COLLECTIVE_TIMEOUT_S
            self._run(lambda rank, learner: learner.kit_function("init_distributed")(
                rank, self.world, self.group.store, timeout_s, waits_s))
        return self._run(fn)

    def loopback_bytes(self) -> int | None:
        """See RankGroup.loopback_bytes."""
        return self.group.loopback_bytes()

    def collectives(self, after: list[int] | None = None) -> list[dict]:
        """Each rank's record of the collectives it entered (worker.collectives), after record
        ``after[rank]``."""
        return self.each(lambda rank, learner: learner.kit_function("collectives")(
            -1 if after is None else after[rank]))

    def _run(self, fn) -> list:
        results, failures = [None] * self.world, []
        started = time.monotonic()

        def run(rank):
            try:
                results[rank] = fn(rank, self.learners[rank])
            except Exception as exc:
                failures.append((time.monotonic(), rank, exc))
                if _COLLECTIVE_FAILED not in str(exc):   # a rank left waiting in a collective says who is missing
                    self.group.stop()

        threads = [threading.Thread(target=run, args=(rank,)) for rank in range(self.world)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            # A collective that failed (a peer gone, or one that never joined) is the consequence of
            # another rank's failure when there is one: that failure is raised, the first in time.
            # Else the lowest rank left waiting speaks: two ranks waiting in different collectives
            # time out in either order, and the same file must always be told the same.
            def cause(failure):
                when, rank, exc = failure
                return (True, rank) if _COLLECTIVE_FAILED in str(exc) else (False, when)

            when, rank, exc = min(failures, key=cause)
            if _COLLECTIVE_FAILED in str(exc) and self.group.running:
                exc = self._not_joined(rank, when - started, exc)
                self.group.left_waiting |= isinstance(exc, CollectiveNotJoined)
            self.group.stop()
            raise exc
        return results

    def _not_joined(self, waiting: int, waited_s: float, exc: Exception) -> Exception:
        """Who left rank ``waiting`` alone in its collective, from every rank's own record of the
        collectives it entered (kept by its process group, read from outside the learner's
        call): the first rank with no collective at that place in the sequence, or another one
        there. ``exc`` itself where the records do not tell."""
        try:
            records = [record["entered"] for record in self.collectives()]
        except Exception:   # a rank that cannot answer any more: gloo's own message is all there is
            return exc
        if not records[waiting]:
            return exc
        at, name, _ = records[waiting][-1]
        for rank, entered in enumerate(records):
            there = next((n for i, n, _ in entered if i == at), None)
            if there == name:
                continue
            said = f"called {there} where rank {waiting} called {name}" if there else f"never called {name}"
            return CollectiveNotJoined(
                f"Rank {rank} {said} (rank {waiting} waited {waited_s:.1f} s): every rank must call every "
                "collective, in the same order, or the ranks that do wait for the others forever.",
                rank=rank, call=getattr(exc, "call", None), output=getattr(exc, "output", ""))
        return exc


def least_sent(ranks: Ranks, run, times: int = 3) -> int | None:
    """The fewest bytes ``ranks`` send over their loopback in one of ``times`` calls of ``run``
    (None where the count is not theirs alone: see RankGroup.loopback_bytes). A count is what the
    code sends plus noise, never less: an acknowledgement of an earlier exchange, a segment resent
    on a loaded machine. What the code sends comes back every call, the noise does not, so the least
    count is the code's. The calls are always ``times``: what the grader asks of the code never
    depends on the noise."""
    counts = []
    for _ in range(times):
        before = ranks.loopback_bytes()
        run()
        after = ranks.loopback_bytes()
        counts.append(None if before is None or after is None else after - before)
    return None if None in counts else min(counts)


def _fingerprint(value) -> bytes:
    """Bytes that equal values share, whatever holds them: a NumPy scalar is its number, an array
    or tensor its dtype, shape and bytes; an object its repr without the address, which differs
    between any two runs."""
    if isinstance(value, (list, tuple)):
        return b"[" + b",".join(_fingerprint(v) for v in value) + b"]"
    if isinstance(value, dict):
        return b"{" + b",".join(k.encode() + b":" + _fingerprint(v) for k, v in sorted(value.items())) + b"}"
    if isinstance(value, np.generic):
        value = value.item()
    if type(value).__module__ == "torch" and type(value).__name__ == "Tensor":
        import torch

        t = value.detach().cpu()
        narrow = t.is_floating_point() and t.element_size() <= 2   # NumPy has no bfloat16, no float8: their bits
        bits = {2: torch.int16, 1: torch.uint8}.get(t.element_size())
        return f"tensor {t.dtype} ".encode() + _fingerprint((t.view(bits) if narrow else t).numpy())
    if isinstance(value, np.ndarray):
        return f"{value.dtype} {value.shape} ".encode() + np.ascontiguousarray(value).tobytes()
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value)).encode()


def _list(value):
    if not isinstance(value, list):
        raise ValueError("expected a list")
    return value


def _npy(array, blobs):
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    blobs.append(buffer.getvalue())
    return len(blobs) - 1


NPY_HEADER_MAX = 4096 + 12   # read_array_header's max_header_size, after the magic and the length
# A header is read by ast.literal_eval, which Python 3.11 can fail with SystemError when two threads
# (a rank group's) build syntax trees at once (CPython gh-106905): one thread reads at a time.
_READING_HEADER = threading.Lock()


def _array(blob) -> np.ndarray:
    """A plain numeric array from a .npy blob, whose header must describe exactly the bytes that
    follow it: a forged header cannot make this process allocate more than the blob it read. The
    array is the blob's own memory where the blob is writable (as ``read_exact``'s are)."""
    stream = io.BytesIO(bytes(memoryview(blob)[:NPY_HEADER_MAX]))   # the header only
    read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                   (2, 0): np.lib.format.read_array_header_2_0}.get(np.lib.format.read_magic(stream))
    if read_header is None:
        raise ValueError("unsupported .npy version")
    with _READING_HEADER:
        shape, fortran, dtype = read_header(stream, max_header_size=4096)
    if dtype.hasobject or dtype.kind not in "biufc" or dtype.names is not None or dtype.subdtype is not None:
        raise ValueError(f"not a plain numeric array ({dtype})")
    data = memoryview(blob)[stream.tell():]
    if math.prod(shape) * dtype.itemsize != len(data):
        raise ValueError("array header does not match its data")
    array = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    return array if array.flags.writeable else array.copy()


def _target(member) -> tuple:
    """The (handle, attribute path) a request names for ``member``: a sandbox object is called."""
    return (member._handle, ["__call__"]) if isinstance(member, Remote) else (member._handle, member._path)


def _custom_operators(ops) -> set[str]:
    """The custom operators (torch.library's) among recorded calls: the recorder sees such an
    operator called, never the torch calls its body makes."""
    found = set()
    for op in ops:
        module = str(op.get("module") or "")
        if module.startswith("torch._ops.") and module != "torch._ops.aten":   # aten: torch's own
            found.add(f"torch.ops.{module.removeprefix('torch._ops.')}.{op.get('name')}")
    return found


def _torch_dtype(torch, name):
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def _output(reply) -> str:
    text = reply.get("output") if isinstance(reply.get("output"), str) else ""
    dropped = reply.get("output_dropped")
    if type(dropped) is int and dropped > 0:
        text += f"\n… {dropped:,} more characters of output were dropped."
    return text


def describe_value(value) -> str:
    """How a value is named in messages: ``float32[3, 4]``, ``tensor float64[2, 5] on cpu``."""
    if isinstance(value, np.ndarray):
        return f"ndarray {value.dtype}{list(value.shape)}"
    if isinstance(value, Foreign):
        return f"{value.type_name} ({value.text})" if value.text else value.type_name
    if isinstance(value, Remote):
        return value.type_name
    if type(value).__module__ == "torch" and type(value).__name__ in ("Tensor", "Parameter"):
        return f"tensor {str(value.dtype).removeprefix('torch.')}{list(value.shape)} on {value.device}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(describe_value(v) for v in value[:4])
        more = ", …" if len(value) > 4 else ""
        return f"{type(value).__name__} ({inner}{more})" if isinstance(value, tuple) else f"[{inner}{more}]"
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def call_text(label: str, args, kwargs) -> str:
    parts = [_arg_text(a) for a in args] + [f"{k}={_arg_text(v)}" for k, v in kwargs.items()]
    return f"{label}({', '.join(parts)})"


def _arg_text(value) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{list(value.shape)}"
    if type(value).__module__ == "torch" and type(value).__name__ in ("Tensor", "Parameter"):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    if isinstance(value, dict):
        return "{…}"
    return describe_value(value)


def snapshot(value, strided: bool = False):
    """A copy of ``value`` for a tape, as it is now (a grader may change its arrays after a call):
    a sandbox object as the Handle it is known by; ``strided``: a slice as a slice of a copy of
    its span, gaps and all, as a Triton kata's sandbox gets it (tape.spread)."""
    if isinstance(value, Remote):
        return Handle(value._handle, value.type_name)
    if isinstance(value, (list, tuple)):
        return type(value)(snapshot(v, strided) for v in value)
    if isinstance(value, dict):
        return {k: snapshot(v, strided) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return value.copy()
    if type(value).__module__ == "torch" and type(value).__name__ in ("Tensor", "Parameter"):
        if value.device.type == "meta":
            return value
        if strided:
            base, form = spread(value)
            return viewed(base, list(value.shape), form).requires_grad_(value.requires_grad)
        return value.detach().clone().requires_grad_(value.requires_grad)
    return value
