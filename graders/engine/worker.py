"""The sandbox worker: the only process in which a learner's code runs.

It is started by path as a zygote, ``python -I worker.py SOCKET_FD FRAMEWORKS``, with a scrubbed
environment, so it imports nothing from the kit: the trusted side imports the wire format from
here, never the other way round. The zygote forks one worker per learner file (see ``zygote``);
a worker runs in its own empty temporary directory holding a copy of that file and answers
requests one at a time: load the learner's file, call a function or a method of an object it
returned (with arguments it keeps from an earlier request, and without sending the result back,
when the trusted side measures the call's peak memory from outside), read an attribute, describe
a module, time a call or tally the tensors it makes (for plots), and hand out one of the kit's own
functions (KIT_FUNCTIONS) to call beside the learner's. Values cross as JSON and ``.npy`` blobs,
never pickle.

Nothing in this process is trusted. The learner's code can replace any of it; the trusted side
parses every reply strictly and judges only plain data.
"""
import ctypes
import errno
import io
import json
import os
import resource
import signal
import struct
import sys
import traceback
import types

MAX_HEADER = 16 << 20   # bytes of JSON in one frame
MAX_BLOBS = 256 << 20   # bytes of .npy data in one frame
MAX_DEPTH = 64          # nesting of a frame's JSON: values are decoded recursively
OUTPUT_CAP = 16 << 10   # characters of printed output kept per request


# --- wire format: frame = 4-byte length, JSON header, then the .npy blobs it lists ---------------

def encode_frame(header, blobs=()):
    data = json.dumps(dict(header, blobs=[len(b) for b in blobs])).encode()
    return b"".join([struct.pack(">I", len(data)), data, *blobs])


def write_frame(fd, header, blobs=()):
    view = memoryview(encode_frame(header, blobs))
    while view:
        view = view[os.write(fd, view):]


def read_exact(fd, n, wait=None):
    """Read n bytes into one buffer, so that a reply of n bytes costs n bytes (a bytearray: arrays
    are read from it without a copy); ``wait()``, if given, blocks until fd is readable or raises."""
    buffer = bytearray(n)
    view, got = memoryview(buffer), 0
    while got < n:
        if wait is not None:
            wait()
        read = os.readv(fd, [view[got:got + (1 << 20)]])
        if not read:
            raise EOFError("the other side closed the channel")
        got += read
    return buffer


def parse_frame(read):
    """One frame, pulling bytes with ``read(n)``; sizes are checked before anything is read."""
    (size,) = struct.unpack(">I", read(4))
    if size > MAX_HEADER:
        raise ValueError(f"frame header of {size} bytes is larger than allowed")
    try:
        header = json.loads(read(size))
    except RecursionError:
        raise ValueError("frame header nested too deeply") from None
    if not isinstance(header, dict) or not isinstance(header.get("blobs"), list):
        raise ValueError("not a frame")
    if _too_deep(header):
        raise ValueError(f"frame header nested deeper than {MAX_DEPTH} levels")
    sizes = header["blobs"]
    if not all(type(s) is int and s >= 0 for s in sizes) or sum(sizes) > MAX_BLOBS:
        raise ValueError("frame announces invalid or oversized arrays")
    return header, [read(s) for s in sizes]


def _too_deep(value):
    stack = [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    return False


def read_frame(fd, wait=None):
    return parse_frame(lambda n: read_exact(fd, n, wait))


# --- values ------------------------------------------------------------------------------------

class Codec:
    """Turns learner values into JSON + .npy blobs, and request arguments back into values.

    Objects that are not plain data (a module, a generator) stay here and cross as handles.
    """

    def __init__(self):
        self.objects = {}   # handle -> object
        self.handles = {}   # id(object) -> handle

    def handle(self, obj):
        key = id(obj)
        if key not in self.handles:
            self.handles[key] = len(self.objects)
            self.objects[self.handles[key]] = obj
        return self.handles[key]

    def encode(self, value, blobs):
        import numpy as np

        if value is None or type(value) in (bool, int, str):
            return value
        if type(value) is float:
            return {"float": repr(value)}
        if type(value) in (list, tuple):
            return {type(value).__name__: [self.encode(v, blobs) for v in value]}
        if isinstance(value, dict) and all(type(k) is str for k in value):
            return {"dict": {k: self.encode(v, blobs) for k, v in value.items()},
                    "type": _qualname(value)}
        if type(value) is np.ndarray and value.dtype != object:
            return {"ndarray": _npy(value, blobs)}
        if isinstance(value, np.generic) and type(value).__module__ == "numpy":
            return {"npscalar": _npy(np.asarray(value), blobs)}
        torch = sys.modules.get("torch")
        if torch is not None:
            if isinstance(value, torch.Tensor):
                return self._encode_tensor(torch, value, blobs)
            if isinstance(value, torch.dtype):
                return {"torch_dtype": str(value)}
            if isinstance(value, torch.device):
                return {"torch_device": str(value)}
        return {"handle": self.handle(value), "type": _qualname(value), "repr": _short_repr(value)}

    def _encode_tensor(self, torch, t, blobs):
        meta = {"tensor": None, "dtype": str(t.dtype), "device": str(t.device),
                "shape": list(t.shape), "type": _qualname(t), "requires_grad": bool(t.requires_grad),
                "contiguous": bool(t.is_contiguous()) if t.layout == torch.strided else False}
        if t.device.type != "meta":
            data = t.detach().to("cpu").as_subclass(torch.Tensor)
            # no bfloat16 or float8 in NumPy; float32 holds every value of each exactly
            if data.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
                data = data.float()
            meta["tensor"] = _npy(data.resolve_conj().resolve_neg().numpy(), blobs)
        return meta

    def decode(self, value, blobs):
        if value is None or type(value) in (bool, int, str, float):
            return value
        if "float" in value:
            return float(value["float"])
        if "list" in value:
            return [self.decode(v, blobs) for v in value["list"]]
        if "tuple" in value:
            return tuple(self.decode(v, blobs) for v in value["tuple"])
        if "dict" in value:
            return {k: self.decode(v, blobs) for k, v in value["dict"].items()}
        if "ndarray" in value:
            return _load(blobs[value["ndarray"]])
        if "npscalar" in value:
            return _load(blobs[value["npscalar"]])[()]
        if "handle" in value:
            return self.objects[value["handle"]]
        import torch

        if "torch_dtype" in value:
            return getattr(torch, value["torch_dtype"].removeprefix("torch."))
        if "torch_device" in value:
            return torch.device(value["torch_device"])
        if "tensor" in value:
            dtype = getattr(torch, value["dtype"].removeprefix("torch."))
            if value["tensor"] is None:
                return torch.empty(value["shape"], dtype=dtype, device=value["device"])
            t = torch.from_numpy(_load(blobs[value["tensor"]])).to(dtype).to(value["device"])
            if value.get("permute"):   # a view of a contiguous base, with the sender's strides
                t = t.permute(value["permute"])
            elif value.get("strides"):   # a slice of the span of storage sent
                t = t.as_strided(value["shape"], value["strides"])
            return t.requires_grad_(value.get("requires_grad", False))
        raise ValueError(f"cannot decode {value!r}")


def _npy(array, blobs):
    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    blobs.append(buffer.getvalue())
    return len(blobs) - 1


def _load(blob):
    import numpy as np

    return np.load(io.BytesIO(blob), allow_pickle=False)


def _qualname(obj):
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _short_repr(obj):
    try:
        text = object.__repr__(obj)
    except Exception:
        text = "?"
    return text[:200]


# --- what the learner's code prints ------------------------------------------------------------

class CappedWriter(io.TextIOBase):
    """Keeps the first OUTPUT_CAP characters and counts the rest, so a print flood costs nothing."""

    def __init__(self):
        self.kept, self.size, self.dropped = [], 0, 0

    def writable(self):
        return True

    def write(self, text):
        text = str(text)
        room = OUTPUT_CAP - self.size
        if room > 0:
            self.kept.append(text[:room])
            self.size += len(text[:room])
        self.dropped += max(0, len(text) - max(room, 0))
        return len(text)

    def take(self):
        text, dropped = "".join(self.kept), self.dropped
        self.kept, self.size, self.dropped = [], 0, 0
        return text, dropped


# --- recording which torch functions ran -------------------------------------------------------

def _summary(value):
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "dtype": str(value.dtype), "device": str(value.device)}
    if value is None or type(value) in (bool, int, float, str):
        return value
    if type(value) in (list, tuple):
        return [_summary(v) for v in value[:8]]
    return _qualname(value)


def _recorder():
    """The recorder of a structure check's calls, made before the learner's file is imported (so
    that no later change to torch's modules reaches it): ``Recorder(ops, source)`` records, in call
    order, every torch function called (a TorchFunctionMode) and every nn.Module called (a global
    forward pre-hook; these entries have ``"kind": "module"`` and the class's name and module). A
    custom operator is recorded by its own name, not by what its body calls (the trusted side
    refuses it). While a torch function runs, the mode steps aside, so code of the learner's file
    (``source``, its name in tracebacks) that torch calls from inside one (a tensor subclass's
    handler, a ``__len__`` or ``__repr__`` torch's Python code reaches, a callback) would run
    unrecorded: a profile hook, set only while a torch function runs, records each such function
    once, as ``"kind": "below"`` (the trusted side refuses the file)."""
    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.overrides import TorchFunctionMode

    class Recorder(TorchFunctionMode):
        def __init__(self, ops, source=None):   # source None: the trusted side's own recordings
            super().__init__()
            self.ops, self.source, self.depth, self.below = ops, source, 0, set()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            self.ops.append({"kind": "function", "name": getattr(func, "__name__", repr(func)),
                             "module": getattr(func, "__module__", None) or "",
                             "args": [_summary(a) for a in args],
                             "kwargs": {k: _summary(v) for k, v in kwargs.items()}})
            watch = self.source is not None and self.depth == 0
            self.depth += 1
            if watch:
                sys.setprofile(self._called)
            try:
                return func(*args, **kwargs)
            finally:
                self.depth -= 1
                if watch:
                    sys.setprofile(None)

        def _called(self, frame, event, arg):
            code = frame.f_code
            if event == "call" and code.co_filename == self.source and code.co_name not in self.below:
                self.below.add(code.co_name)
                self.ops.append({"kind": "below", "name": code.co_name, "module": "", "args": [], "kwargs": {}})

        def _module_called(self, module, args):
            cls = type(module)
            self.ops.append({"kind": "module", "name": cls.__name__, "module": cls.__module__,
                             "args": [_summary(a) for a in args], "kwargs": {}})

        def __enter__(self):
            self.hook = register_module_forward_pre_hook(self._module_called)
            return super().__enter__()

        def __exit__(self, *exc):
            super().__exit__(*exc)
            self.hook.remove()

    return Recorder


# --- what Triton's interpreter ran ---------------------------------------------------------------

def _launched(value):
    """A kernel argument as a launch's record shows it: a tensor with its strides and offset too
    (whether the launcher passed its input or a copy of it)."""
    summary = _summary(value)
    if isinstance(summary, dict):
        summary.update(stride=list(value.stride()), offset=int(value.storage_offset()))
    return summary


class KernelTracer:
    """Hooks on Triton's interpreter, set before the learner's file is imported, so that what a
    kernel does is judged by what it ran: each launch appended to the recording as ``"kind":
    "kernel"`` (the kernel's name, its grid, its tensor arguments, and per argument the loads, the
    lanes read, the distinct elements read and the most reads of one element; per program the
    loads of each argument and the largest block it made). Lanes outside every tensor argument are
    counted, and neither read nor written: a missing mask reads the worker's own memory, which would
    make the grade depend on what lay there. The interpreter's own torch calls (a launch copies its
    arguments) stay out of the recording of torch functions. The learner's file cannot name these
    hooks: the static check refuses the interpreter's names (structure.TRITON_DENIED)."""

    def __init__(self):
        import numpy as np
        import torch
        from triton.runtime import interpreter

        self.np, self.ops, self.launch, self.program = np, None, None, None
        builder, executor = interpreter.InterpreterBuilder, interpreter.GridExecutor
        load, store, dot, grid_idx = (builder.create_masked_load, builder.create_masked_store, builder.create_dot,
                                      builder.set_grid_idx)
        init_args, call = executor._init_args_hst, executor.__call__
        tracer = self

        def masked_load(self, ptrs, mask, other, *rest, **kwargs):
            return load(self, ptrs, tracer.access(ptrs, mask, "load"), other, *rest, **kwargs)

        def masked_store(self, ptrs, value, mask, *rest, **kwargs):
            return store(self, ptrs, value, tracer.access(ptrs, mask, "store"), *rest, **kwargs)

        def traced_dot(self, a, b, d, *rest):
            out = dot(self, a, b, d, *rest)
            tracer.block(out.data.size)
            return out

        def set_grid_idx(self, x, y, z):
            grid_idx(self, x, y, z)
            tracer.start_program()

        def init_args_hst(self, args_dev, kwargs):
            args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
            tracer.start_launch(self.fn, self.arg_names, args_hst, kwargs_hst)
            return args_hst, kwargs_hst

        def traced_call(self, *args, **kwargs):
            with torch._C.DisableTorchFunction():
                try:
                    return call(self, *args, **kwargs)
                finally:
                    tracer.end_launch()

        # A @jit function called from a kernel (tl.max, tl.sum, the file's own helpers) patches the
        # modules of its globals on every call, and never restores them: a quarter of a kernel's
        # time on the interpreter. Patched once per module, they stay as the first call left them.
        patched = set()

        def nested_call(self, *args, **kwargs):
            if id(self.fn.__globals__) not in patched:
                interpreter._patch_lang(self.fn)
                patched.add(id(self.fn.__globals__))
            fn = self.rewrite()
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                raise interpreter.InterpreterError(repr(e)) from e

        builder.create_masked_load, builder.create_masked_store = masked_load, masked_store
        builder.create_dot, builder.set_grid_idx = traced_dot, set_grid_idx
        executor._init_args_hst, executor.__call__ = init_args_hst, traced_call
        interpreter.InterpretedFunction.__call__ = nested_call

    def start_launch(self, fn, arg_names, args, kwargs):
        values = dict(zip(arg_names, args)) | kwargs
        tensors = [(name, v) for name, v in values.items() if hasattr(v, "untyped_storage")]
        spans = []
        for name, t in tensors:
            start = t.untyped_storage().data_ptr()
            spans.append((start, start + t.untyped_storage().nbytes(), name, t.element_size()))
        self.launch = {"kind": "kernel", "name": getattr(fn, "__name__", "?"), "module": "triton", "grid": None,
                       "args": {name: _launched(v) for name, v in values.items()},
                       "spans": sorted(spans), "counts": {}, "programs": [], "outside": {"load": 0, "store": 0},
                       "loads": {}, "stores": {}}

    def start_program(self):
        if self.launch is not None:
            self.program = {"loads": {}, "largest": 0}
            self.launch["programs"].append(self.program)

    def block(self, size):
        if self.program is not None:
            self.program["largest"] = max(self.program["largest"], int(size))

    def access(self, ptrs, mask, kind):
        """``mask`` with the lanes outside every tensor argument turned off (and counted); the
        lanes of each argument counted, for a load per element."""
        np, launch = self.np, self.launch
        if launch is None:
            return mask
        addresses = ptrs.data.astype(np.int64)
        active = np.broadcast_to(mask.data, addresses.shape).astype(bool)
        inside = np.zeros(addresses.shape, dtype=bool)
        self.block(addresses.size)
        for start, end, name, size in launch["spans"]:
            lanes = active & (addresses >= start) & (addresses < end)
            inside |= lanes
            if self.ops is None or not lanes.any():   # tallied only for a recording
                continue
            tally = launch["loads" if kind == "load" else "stores"]
            calls, count = tally.get(name, (0, 0))
            tally[name] = (calls + 1, count + int(lanes.sum()))
            if kind == "load":
                self.program["loads"][name] = self.program["loads"].get(name, 0) + 1
                counts = launch["counts"].setdefault(name, np.zeros((end - start) // size, dtype=np.int64))
                np.add.at(counts, (addresses[lanes] - start) // size, 1)
        launch["outside"][kind] += int((active & ~inside).sum())
        return type(mask)(active & inside, mask.dtype)   # a new mask: the kernel may use its own again

    def end_launch(self):
        launch, self.launch, self.program = self.launch, None, None
        if launch is None or self.ops is None:
            return
        from triton.runtime import interpreter

        launch["grid"] = list(interpreter.interpreter_builder.grid_dim)
        counts = launch.pop("counts")
        launch.pop("spans")
        launch["reads"] = {name: {"loads": launch["loads"].get(name, (0, 0))[0], "lanes": launch["loads"][name][1],
                                  "distinct": int((c > 0).sum()), "most": int(c.max())}
                           for name, c in counts.items()}
        launch["stores"] = {name: {"stores": calls, "lanes": lanes} for name, (calls, lanes) in launch["stores"].items()}
        del launch["loads"]
        self.ops.append(launch)


def drawn_seed(seed) -> int:
    """What a grading's ``seed`` seeds the learner's random generators with (Worker.seed): hashed
    into 32 bits, so that what the code can read back says nothing of the seed's range."""
    import hashlib

    return int.from_bytes(hashlib.blake2b(str(seed).encode(), digest_size=4, person=b"kata-seed").digest(), "big")


_TRACER = None


def kernel_tracer() -> KernelTracer:
    """This process's hooks on Triton's interpreter, set once: a second set would wrap the first,
    and see masks the first already cleared (a grader's dry run makes a Worker in the trusted
    process, beside the hooks its references run with)."""
    global _TRACER
    if _TRACER is None:
        _TRACER = KernelTracer()
    return _TRACER


# --- the server --------------------------------------------------------------------------------

class MissingName(Exception):
    """The requested function, class or attribute does not exist."""


class Worker:
    def __init__(self, req_fd, resp_fd, framework):
        self.req_fd, self.resp_fd = req_fd, resp_fd
        self.framework = framework
        self.codec = Codec()
        self.module = None
        self.source_name = None
        # Made before the learner's file is imported wherever torch is loaded by then (the
        # zygote loads it for every torch kata).
        self.recorder = _recorder() if "torch" in sys.modules else None
        self.views = _module_views() if "torch" in sys.modules else None
        self.tracer = None
        if framework in ("triton", "triton-compiled"):
            import triton

            # The environment is the trusted side's, which sets no TRITON_INTERPRET: the kernels of
            # a Triton kata run on the interpreter but for a @cuda check's compiled copy (a zygote
            # of its own), which writes its cache in the worker's own folder.
            triton.knobs.runtime.interpret = framework == "triton"
            triton.knobs.cache.dir = os.path.join(os.getcwd(), ".triton")
            self.tracer = kernel_tracer() if framework == "triton" else None

    def serve(self):
        import numpy  # noqa: F401  (the import is the warm-up)

        if self.framework in ("torch", "triton", "triton-compiled"):
            import torch

            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        write_frame(self.resp_fd, {"op": "ready", "pid": os.getpid()})
        while True:
            try:
                request, blobs = read_frame(self.req_fd)
            except EOFError:
                return
            reply, out_blobs = self.handle(request, blobs)
            write_frame(self.resp_fd, reply, out_blobs)

    def handle(self, request, blobs):
        op = request.get("op")
        out = CappedWriter()
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = out
        ops = []
        reply, out_blobs = {"ok": True}, []
        try:
            if request.get("seed") is not None:
                self.seed(request["seed"])
            if op == "load":
                reply["names"] = self.load(request["path"], request["name"])
            elif op == "measure":
                target = self.resolve(request["target"])
                args = [self.codec.decode(a, blobs) for a in request.get("args", [])]
                kwargs = {k: self.codec.decode(v, blobs) for k, v in request.get("kwargs", {}).items()}
                reply["value"] = self.codec.encode(_measure(target, args, kwargs, request["repeats"]), out_blobs)
            elif op == "keep":   # the arguments of a call to come, so that decoding them is not part of it
                def kept(value):
                    return {"handle": self.codec.handle(self.codec.decode(value, blobs)), "type": "kept", "repr": ""}

                reply["value"] = {"list": [{"list": [kept(a) for a in request["args"]]},
                                           {"dict": {k: kept(v) for k, v in request["kwargs"].items()}}]}
            elif op == "peak":
                target = self.resolve(request["target"])
                args = [self.codec.decode(a, blobs) for a in request.get("args", [])]
                kwargs = {k: self.codec.decode(v, blobs) for k, v in request.get("kwargs", {}).items()}
                peak = _peak_bytes(target, args, kwargs, cuda=request.get("device") == "cuda")
                reply["value"] = self.codec.encode(peak, out_blobs)
            elif op == "kit":
                reply["value"] = self.codec.encode(KIT_FUNCTIONS[request["name"]], out_blobs)
            elif op in ("call", "getattr", "module_info"):
                args, kwargs = [], {}
                try:
                    target = self.resolve(request["target"])
                except AttributeError as exc:
                    raise MissingName(str(exc)) from None
                if op == "getattr":
                    result = target
                elif op == "module_info":
                    result = _module_info(target, self.views)
                else:
                    args = [self.codec.decode(a, blobs) for a in request.get("args", [])]
                    kwargs = {k: self.codec.decode(v, blobs) for k, v in request.get("kwargs", {}).items()}
                    if request.get("record") and "torch" in sys.modules:
                        if self.recorder is None:   # a NumPy kata's file that imported torch itself
                            self.recorder = _recorder()
                        if self.tracer is not None:
                            self.tracer.ops = ops
                        try:
                            with self.recorder(ops, self.source_name):
                                result = target(*args, **kwargs)
                        finally:
                            if self.tracer is not None:
                                self.tracer.ops = None
                    else:
                        result = target(*args, **kwargs)
                reply["value"] = None if request.get("discard") else self.codec.encode(result, out_blobs)
                if request.get("echo"):   # the arguments as the call left them: did it write into them?
                    reply["args_after"] = self.codec.encode([args, kwargs], out_blobs)
            else:
                raise ValueError(f"unknown request {op!r}")
        except BaseException as exc:  # the learner's exit, recursion or exception is data here
            reply, out_blobs = {"ok": False, "error": self.describe(exc)}, []
        finally:
            sys.stdout, sys.stderr = saved
        reply["output"], reply["output_dropped"] = out.take()
        if request.get("record"):
            reply["ops"] = ops
        return reply, out_blobs

    def seed(self, seed):
        """Seed the random generators the learner's code may use, so that the same seed makes the
        same draws, with a value hashed from the grading's seed: what the code can read back
        (NumPy's state, torch.initial_seed()) falls anywhere in 32 bits, whether the seed is a
        self-study one or a class's (whose ranges differ, see classroom.rules)."""
        import random

        import numpy as np

        seed = drawn_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.manual_seed(seed)
        elif torch is not None:
            # torch.manual_seed also queues a seed for each accelerator it was built for, formatting
            # the stack for each: a millisecond a call, the most of a small call's time. On a machine
            # without CUDA the CPU's generator is all there is to seed.
            torch.default_generator.manual_seed(seed)

    def load(self, path, name):
        # The copy sits in the working directory under the learner's file name, so tracebacks
        # show "softmax.py", line 12 and linecache finds the source.
        with open(path, encoding="utf-8") as f:
            source = f.read()
        self.source_name = os.path.basename(path)
        code = compile(source, self.source_name, "exec")
        module = types.ModuleType(name)
        module.__file__ = os.path.abspath(path)
        sys.modules[name] = module
        exec(code, module.__dict__)
        self.module = module
        return sorted(k for k in vars(module) if not k.startswith("_"))

    def resolve(self, target):
        handle, path = target
        if handle is None and self.module is None:
            raise RuntimeError("the learner's file is not loaded")
        obj = self.module if handle is None else self.codec.objects[handle]
        for part in path:
            obj = getattr(obj, part)
        return obj

    def describe(self, exc):
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == self.source_name]
        where = [{"line": f.lineno, "function": f.name, "text": (f.line or "").strip()} for f in frames]
        if isinstance(exc, SyntaxError) and exc.filename == self.source_name:
            where = [{"line": exc.lineno, "function": "<module>", "text": (exc.text or "").strip()}]
        try:
            message = str(exc)
        except BaseException:
            message = "<the exception's message could not be read>"
        kind = type(exc)
        return {"type": kind.__name__, "module": kind.__module__, "message": message[:2000],
                "where": where[-5:],
                "not_implemented": isinstance(exc, NotImplementedError),
                "missing": isinstance(exc, MissingName),
                "exit": isinstance(exc, SystemExit)}


def _measure(target, args, kwargs, repeats):
    """One warm-up call, then ``repeats`` calls, synchronised; the peak CUDA memory they took
    above what was allocated before (None on the CPU). The caller times the request itself."""
    import torch

    cuda = torch.cuda.is_available()
    with torch.no_grad():
        target(*args, **kwargs)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        for _ in range(repeats):
            target(*args, **kwargs)
        if cuda:
            torch.cuda.synchronize()
    return {"peak_bytes": torch.cuda.max_memory_allocated() - base if cuda and repeats else None}


def _peak_bytes(target, args, kwargs, cuda):
    """The peak memory one call of ``target`` (no grad) takes above what was allocated before it:
    the CUDA allocator's peak on CUDA; on the CPU, which keeps no such statistic, the largest total
    of the tensors the call created that were alive at the same time. Measured in here, so for
    the learner's own plots only: a grade uses what the kernel counts (``Learner.peak_bytes``)."""
    import torch

    with torch.no_grad():
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            target(*args, **kwargs)
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - base
        with _live_bytes() as live:
            target(*args, **kwargs)
        return live.peak


def _live_bytes():
    """A dispatch mode that adds the bytes of each new storage an operator returns and subtracts
    them when the storage is freed; ``peak`` is the highest total. Views and in-place results
    share a storage already counted, so they add nothing."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class LiveBytes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live = self.peak = 0
            self.counted = set()   # data pointers of live storages already added

        def _freed(self, key, size):
            self.live -= size
            self.counted.discard(key)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    storage = t.untyped_storage()
                    key, size = storage.data_ptr(), storage.nbytes()
                    if size and key not in self.counted:
                        self.counted.add(key)
                        self.live += size
                        self.peak = max(self.peak, self.live)
                        weakref.finalize(storage, self._freed, key, size)
            return out

    return LiveBytes()


def sdpa_self_attention(x, qkv_weight, qkv_bias, out_weight, out_bias, n_heads, causal=True):
    """Multi-head self-attention through F.scaled_dot_product_attention, with a fused
    [W_q; W_k; W_v] projection: kit code that `kata plot mha --kind complexity` measures in the
    sandbox beside the learner's module, on the same weights and input."""
    import torch.nn.functional as F

    B, T, C = x.shape
    q, k, v = F.linear(x, qkv_weight, qkv_bias).split(C, dim=-1)   # (B, T, C) each
    q, k, v = (t.view(B, T, n_heads, C // n_heads).transpose(1, 2) for t in (q, k, v))   # (B, H, T, hd)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)   # (B, H, T, hd)
    return F.linear(y.transpose(1, 2).reshape(B, T, C), out_weight, out_bias)   # (B, T, C)


def naive_attention(q, k, v, causal=False):
    """softmax(q kᵀ / sqrt(head_dim)) v with the whole (B, H, Tq, Tk) score matrix built: kit code
    that `kata plot flash-tiling` measures in the sandbox beside the learner's tiled version. Causal
    is bottom-right aligned (query i sees keys 0 .. Tk - Tq + i)."""
    import torch

    scores = torch.matmul(q, k.mT) * q.size(-1) ** -0.5   # (B, H, Tq, Tk): the whole matrix, built
    if causal:
        # True above the bottom-right aligned diagonal: the keys after each query's position.
        future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(k.size(-2) - q.size(-2) + 1)
        scores = scores.masked_fill(future, float("-inf"))   # (B, H, Tq, Tk)
    return scores.softmax(dim=-1) @ v   # (B, H, Tq, hd)


def init_distributed(rank, world_size, store, timeout_s, collective_timeout_s):
    """Join this rank's group: torch.distributed's default process group (gloo), met within
    ``timeout_s`` through ``store``: a file every rank of the group can reach, or a ``tcp://``
    address where the ranks may make no file (a grading container, see seccomp.NO_NEW_FILES). A
    collective that some rank never joins fails after ``collective_timeout_s`` rather than
    waiting for the sandbox's wall clock. Gloo binds to the loopback, the only interface of a
    rank group's own network, rather than look up the host's name. The group keeps its own
    record of the collectives this rank enters (torch's flight recorder), and of the async ones
    never waited on (its registry of works in flight): what ``collectives`` reads."""
    import datetime

    import torch._C._distributed_c10d as c10d
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(FLIGHT_RECORDS)   # read when the group is made
    c10d._set_allow_inflight_collective_as_graph_input(True)   # an async work stays registered until waited on
    dist.init_process_group("gloo", init_method=store if "://" in store else f"file://{store}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=collective_timeout_s))


FLIGHT_RECORDS = 64   # the collectives the flight recorder keeps, the latest: more than a forward needs


def collectives(after=-1):
    """What this rank's process group recorded: ``{"entered": [[record id, name, first input's
    shape], ...], "unwaited": n}``, the collectives entered since record ``after`` (``all_reduce``,
    ``barrier``, ..., whoever called them: torch.distributed's functions or the group's own
    methods) and the async ones never waited on so far."""
    import json

    import torch._C._distributed_c10d as c10d

    trace = json.loads(c10d._dump_fr_trace_json(True, False))
    entered = [[e["record_id"], e["profiling_name"].rpartition(":")[2], (e["input_sizes"] or [None])[0]]
               for e in trace.get("entries", []) if e["record_id"] > after]
    return {"entered": entered, "unwaited": c10d._get_work_registry_size()}


def all_reduce(tensor):
    """One sum all-reduce over the default process group: kit code whose traffic on a rank group's
    loopback the trusted side measures, to weigh the learner's collectives against."""
    import torch.distributed as dist

    dist.all_reduce(tensor)
    return tensor


# Kit functions a request may ask a handle to (the "kit" op), to be called and measured like the
# learner's own code.
KIT_FUNCTIONS = {"sdpa_self_attention": sdpa_self_attention, "naive_attention": naive_attention,
                 "init_distributed": init_distributed, "all_reduce": all_reduce, "collectives": collectives}


def _module_views():
    """(a module's own __dict__, a tensor's shape, dtype, device) as nn.Module and torch's tensor
    type keep them, taken before the learner's file is imported: its class may define ``__dict__``
    (a property giving other dicts) or a Parameter subclass ``shape``, which ``obj.__dict__`` and
    ``t.shape`` would ask."""
    import torch

    tensor = vars(torch._C.TensorBase)
    return tuple(d.__get__ for d in (vars(torch.nn.Module)["__dict__"], tensor["shape"], tensor["dtype"],
                                     tensor["device"]))


def _module_info(module, views=None):
    """What nn.Module keeps in its own dicts, read the way named_parameters(), named_buffers() and
    state_dict() read them, without calling those methods: the learner's class can override them
    (or __getattr__, __dict__, its dicts' methods or its tensors' shape) to report a parameter it
    does not have, or hide one it has. ``views``: _module_views, taken before the file ran where torch
    was loaded by then."""
    import torch

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {_qualname(module)}")
    own_dict, shape, dtype, device = views or _module_views()
    found = {"_parameters": {}, "_buffers": {}}
    seen = {"_parameters": set(), "_buffers": set()}   # a tensor two modules share is named once
    state_dict = []

    def walk(m, prefix):
        own = own_dict(m)   # nn.Module's own: raises for an object that only claims to be one
        for kind in found:
            for name, t in dict.items(own[kind]):
                if t is None:
                    continue
                if kind == "_parameters" or not set.__contains__(own["_non_persistent_buffers_set"], name):
                    state_dict.append(prefix + name)
                if id(t) not in seen[kind]:
                    seen[kind].add(id(t))
                    found[kind][prefix + name] = [list(shape(t)), str(dtype(t)), str(device(t))]
        for name, child in dict.items(own["_modules"]):
            if child is not None:
                walk(child, f"{prefix}{name}.")

    walk(module, "")
    return {"type": _qualname(module), "training": bool(own_dict(module)["training"]),
            "parameters": found["_parameters"], "buffers": found["_buffers"], "state_dict": state_dict}


def limit_memory(memory_mb):
    if memory_mb > 0:
        # RLIMIT_AS would break `import torch` (it reserves address space); the data limit does not.
        limit = memory_mb << 20
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def main(argv):
    zygote(argv[1].split(","), isolated="isolated" in argv[2:], warm="warm" in argv[2:])


# --- the zygote: fork a warm worker per learner file ----------------------------------------------

NPROC = 64                  # processes and threads of one sandbox: no fork bomb
MAX_RANKS = 8               # workers of one rank group (see _fork_isolated)
RANK_FILES = 256            # open files of a rank, sockets included: their buffers are kernel memory
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 1
FILE_BYTES = 64 << 20       # the largest file a worker may write
TMP_BYTES = 64 << 20        # each of the worker's private /tmp and /dev/shm
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER, PR_SET_SECCOMP = 1, 38, 36, 22
SECCOMP_MODE_FILTER = 2
KEYCTL_JOIN_SESSION_KEYRING = 1
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = (
    0x20000, 0x4000000, 0x8000000, 0x20000000, 0x40000000)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = (
    1, 2, 4, 8, 32, 1024, 2048, 4096)
MS_REC, MS_PRIVATE, MS_RELATIME = 1 << 14, 1 << 18, 1 << 21
_libc = None


def zygote(frameworks, isolated=False, warm=False):
    """Import NumPy/torch once, then fork a worker per request, so a sandbox costs a fork, not an
    interpreter and an ``import torch``. No learner code ever runs in this process: each request
    (a JSON message with the worker's pipes and the learner's file attached) gets a child that
    becomes one sandbox worker. The reply carries a pidfd of the worker, which names it to the
    trusted side across pid namespaces. EOF on the socket means the trusted side is gone: every
    child is killed. The socket is stdin, so that the command line is the same whoever started
    the zygote (`kata check` or `kata grade`).

    ``isolated`` (under bwrap, see bwrap.py): each worker is the first process of fresh pid,
    mount, network, IPC and UTS namespaces, so that everything it starts dies with it and sees
    only its own private /proc, /tmp and /dev/shm. Otherwise (no bwrap) it only leaves this
    session, and as root drops to its own user, whose processes are swept after it.
    ``warm``: also load what the first sandbox of many would otherwise load for itself.
    """
    import socket
    import time

    import numpy  # noqa: F401  (the import is the warm-up)

    global _libc
    _libc = ctypes.CDLL(None, use_errno=True)   # loaded here: a child that dropped privileges need not find it
    if isolated:   # a worker's first parent exits at once: the worker is then our child
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if {"torch", "triton", "triton-compiled"} & set(frameworks):
        import torch
        import torch.nn.functional  # noqa: F401

        torch.set_num_threads(1)
        if "triton" in frameworks:
            # Before the import: triton.language makes its own functions for the interpreter then.
            os.environ["TRITON_INTERPRET"] = "1"
            try:
                import triton.language  # noqa: F401
                import triton.runtime.interpreter  # noqa: F401
            except ImportError:   # not installed: the trusted side says so for each Triton kata
                pass
        if "triton-compiled" in frameworks:   # a @cuda check's: kernels compiled, never interpreted
            import triton.language  # noqa: F401
        if warm:
            # The first operator on a meta tensor loads torch's meta kernels (over a second): done
            # once here rather than in every sandbox that builds a mask on device="meta". Only
            # for many sandboxes: one `kata check` would wait for it even when it needs none.
            torch.ones(1, 1, device="meta").tril()
    sock = socket.socket(fileno=0)
    children = {}   # pid -> uid or None
    exited = {}     # pid -> wait status, of children reaped but not yet asked about
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 16, 4 * MAX_RANKS)
        except OSError:
            break
        if not message:
            break
        request = json.loads(message)
        if request["op"] == "fork":
            pidfds = []
            try:
                ranks = request.get("ranks", 1)
                if not isinstance(ranks, int) or not 1 <= ranks <= MAX_RANKS or len(fds) != 4 * ranks:
                    raise OSError(f"a fork of {ranks!r} workers with {len(fds)} descriptors")
                if isolated:
                    pids = _fork_isolated(sock, fds, request)
                else:
                    pids = [_fork(sock, fds, request, rank=r if "ranks" in request else None) for r in range(ranks)]
                pidfds = [os.pidfd_open(pid) for pid in pids]
            except OSError as exc:
                socket.send_fds(sock, [json.dumps({"error": f"the sandbox could not be made: {exc}"}).encode()], [])
            else:
                for pid in pids:
                    children[pid] = None if isolated else request.get("uid")
                socket.send_fds(sock, [json.dumps({"pid": pids[0], "pids": pids}).encode()], pidfds)
            finally:
                for fd in [*fds, *pidfds]:
                    os.close(fd)
        elif request["op"] == "wait":
            pid, deadline = request["pid"], time.monotonic() + request["timeout_s"]
            while True:
                # Every child that ended is reaped, not only this one: the first rank of a group
                # ends only once the others, our children too, are reaped.
                _reap(exited)
                if pid in exited or pid not in children or time.monotonic() > deadline:
                    break
                time.sleep(0.005)
            status = exited.pop(pid, None)
            if status is not None:
                _sweep(children.pop(pid))
            sock.send(json.dumps({"code": None if status is None else os.waitstatus_to_exitcode(status)}).encode())
    for pid, uid in children.items():
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        _sweep(uid)
    # Nothing to flush: skipping torch's interpreter teardown (a second) spares the caller's wait.
    os._exit(0)


def _fork(sock, fds, request, rank=None):
    pid = os.fork()
    if pid == 0:
        if rank is None:
            _forked(sock, fds, request, isolated=False)
        _forked(sock, _own(fds, rank), dict(request, rank=rank), isolated=False)
    return pid


def _fork_isolated(sock, fds, request):
    """Fork the worker as process 1 of new pid, mount, network, IPC and UTS namespaces: a first
    child makes them and forks the worker, says its pid and exits, and the worker, orphaned, is
    re-parented to this subreaper. When the worker dies, the kernel kills every process left in
    its pid namespace: no daemon, no traced zombie outlives the pair. Returns its pid, in a list.

    A rank group (``request["ranks"]`` workers, 4 descriptors each in ``fds``) shares one set of
    namespaces, so that its ranks talk to each other over a loopback of their own (brought up
    here) and to nothing else. Rank 0 is process 1 (its death ends the others) and makes the
    private mounts that all ranks share; the others are forked once it has. Each rank keeps its
    copy of the learner's file in a folder of its own."""
    ranks = request.get("ranks")
    read_end, write_end = os.pipe()
    first = os.fork()
    if first == 0:
        try:
            os.close(read_end)
            if _libc.unshare(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS) != 0:
                raise OSError(ctypes.get_errno(), "unshare")
            if ranks:
                _loopback_up()
            pids = []
            for rank in range(ranks or 1):
                mounted_r, mounted_w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    os.close(write_end)
                    os.close(mounted_r)
                    mine, asked = (fds, request) if ranks is None else (_own(fds, rank), dict(request, rank=rank))
                    _forked(sock, mine, asked, isolated=True, mounts=rank == 0, mounted=mounted_w)
                os.close(mounted_w)
                with os.fdopen(mounted_r, "rb") as mounted:
                    if mounted.read(1) != b"1":   # it died before it was ready
                        break
                pids.append(pid)
            os.write(write_end, json.dumps(pids).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        said = f.read()
    os.waitpid(first, 0)
    pids = json.loads(said) if said else []
    if len(pids) != (ranks or 1):
        raise OSError("the namespaces of a sandbox could not be made")
    return pids


def _own(fds, rank):
    """A rank's 4 descriptors of a group's ``fds``; the others', which it must not keep (another
    rank's pipes to the grader), are closed in it at once."""
    mine = fds[4 * rank:4 * rank + 4]
    for fd in set(fds) - set(mine):
        os.close(fd)
    return mine


def _loopback_up():
    """Bring up the loopback of a new network namespace (SIOCSIFFLAGS; needs CAP_NET_ADMIN)."""
    import fcntl
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH14x", b"lo", 0)))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def _reap(exited):
    """Reap every child that has ended, keeping its status in ``exited``."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        exited[pid] = status


def _sweep(uid):
    """Kill every process of a sandbox user, in case the learner's code left one running outside
    its process group (a double fork with setsid). Signal -1 as that user reaches exactly them."""
    if uid is None:
        return
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _forked(sock, fds, request, isolated, mounts=True, mounted=None):
    """The child: becomes one sandbox worker and never returns into the zygote's loop. Isolated, it
    makes the private mounts if ``mounts`` (a rank group's rank 0 makes them for all, see
    ``_fork_isolated``), and says on ``mounted`` when they are made."""
    code = 1
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        sock.close()
        os.setsid()
        req_fd, resp_fd, err_fd, source_fd = fds
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(err_fd, 2)
        for fd in {devnull, err_fd} - {0, 1, 2}:
            os.close(fd)
        uid = request.get("uid")
        if isolated and mounts:
            _private_mounts(uid)
        if mounted is not None:
            os.write(mounted, b"1")
            os.close(mounted)
        os.chdir(request["dir"])
        text = _read_whole(source_fd)
        os.environ.clear()
        os.environ.update(request["env"])
        limit_memory(request["memory_mb"])
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_BYTES, FILE_BYTES))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if "rank" in request:
            resource.setrlimit(resource.RLIMIT_NOFILE, (RANK_FILES, RANK_FILES))
        if uid is not None:
            if not isolated:
                _private_proc()
            resource.setrlimit(resource.RLIMIT_NPROC, (NPROC, NPROC))
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)   # a uid change from root clears every capability
        elif isolated:
            resource.setrlimit(resource.RLIMIT_NPROC, (NPROC, NPROC))
            _drop_capabilities()
        confined = request.get("seccomp")   # {"keyctl": its number here, "filter": the BPF program, in hex}
        if confined:
            # A session keyring of its own, empty: none of the grader's keys, none another sandbox
            # left. Where keyctl is refused already (Docker's profile), no keyring can be reached.
            joined = _libc.syscall(confined["keyctl"], KEYCTL_JOIN_SESSION_KEYRING, None) >= 0
            if not joined and ctypes.get_errno() != errno.EPERM:
                raise OSError(ctypes.get_errno(), "keyctl")
        # No set-user-ID program it runs (su, a container's sudo) gives privileges back.
        _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if not isolated:
            # After the credentials change, which clears the parent-death signal. A child that
            # outlives its zygote (killed, not closed) is killed with it. (Isolated: bwrap's
            # --die-with-parent and the pid namespaces do this.)
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        os.umask(0o077)
        if "rank" in request:   # the ranks of a group share a folder
            os.mkdir(f"rank{request['rank']}", 0o700)
            os.chdir(f"rank{request['rank']}")
        # Written as the sandbox user, before the filter (which, in a grading container, lets no
        # file be made): the learner's own copy.
        with open(request["file"], "wb") as copy:
            copy.write(text)
        if request.get("readable"):   # a grading container: no namespace hides the rest of its files
            restrict_reads(request["readable"])
        if confined:
            load_seccomp(bytes.fromhex(confined["filter"]))
        sys.setrecursionlimit(3000)
        Worker(req_fd, resp_fd, request["framework"]).serve()
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _read_whole(fd):
    """The whole file, read from its start whatever its offset (the ranks of a group share one
    open file, and its offset), and closed."""
    chunks, offset = [], 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    os.close(fd)
    return b"".join(chunks)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load_seccomp(program):
    """Load a classic-BPF seccomp filter (8 bytes an instruction) on this process and all it will
    start; needs PR_SET_NO_NEW_PRIVS set first. Filters stack: it adds refusals, never lifts one."""
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter")


# Landlock (Linux 5.13+): a process's own limits on the files it may open, kept by all it starts.
# The same syscall numbers on every architecture.
LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION, LANDLOCK_RULE_PATH_BENEATH = 1, 1
LANDLOCK_EXECUTE, LANDLOCK_READ_FILE, LANDLOCK_READ_DIR = 1, 1 << 2, 1 << 3
LANDLOCK_READ = LANDLOCK_EXECUTE | LANDLOCK_READ_FILE | LANDLOCK_READ_DIR


class _PathBeneath(ctypes.Structure):
    _pack_ = 1   # struct landlock_path_beneath_attr is packed
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The Landlock ABI this kernel offers to this process (0: none, or refused, as by an older
    container's seccomp profile)."""
    libc = _libc or ctypes.CDLL(None, use_errno=True)
    return max(0, libc.syscall(LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), LANDLOCK_CREATE_RULESET_VERSION))


def restrict_reads(paths):
    """Let this process (and all it starts) read, list and run files only beneath ``paths``:
    what a bubblewrap sandbox would show (see bwrap.readable_paths). Writing is the seccomp
    filter's matter. Needs PR_SET_NO_NEW_PRIVS set first; raises OSError where Landlock fails."""
    handled = struct.pack("=Q", LANDLOCK_READ)   # struct landlock_ruleset_attr: handled_access_fs
    ruleset = _libc.syscall(LANDLOCK_CREATE_RULESET, handled, ctypes.c_size_t(len(handled)), 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        for path in paths:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                # A file takes only a file's rights; a folder, a tree's.
                rights = LANDLOCK_READ if os.path.isdir(path) else LANDLOCK_EXECUTE | LANDLOCK_READ_FILE
                rule = _PathBeneath(rights, fd)
                if _libc.syscall(LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        if _libc.syscall(LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def _mount(source, target, fstype, flags, options=None):
    if _libc.mount(source, target, fstype, flags, options) != 0:
        raise OSError(ctypes.get_errno(), f"mount {target.decode()}")


def _private_mounts(uid):
    """In the worker's own mount namespace: a /proc of its own pid namespace (whose clear_refs it
    cannot write), and private, size-capped /tmp and /dev/shm that vanish with it (owned by
    ``uid`` when it will drop to it)."""
    _mount(None, b"/", None, MS_REC | MS_PRIVATE)
    _mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # The grader resets this process's peak resident memory (clear_refs, from outside) before a
    # call whose peak it measures: the learner's code, process 1 here, must not reset it again.
    for path in (b"/proc/1/clear_refs", b"/proc/1/task/1/clear_refs"):
        _mount(b"/dev/null", path, None, MS_BIND)
    # A Python installed under /tmp (a CI runner's virtual environment) is bound there by bwrap:
    # held open now, and bound again (read-only, with what is mounted inside) into the new /tmp.
    held = [(target, os.open(target, os.O_PATH)) for target in _mounts_below("/tmp")]
    owner = f",uid={uid},gid={uid}" if uid is not None else ""
    for target in (b"/tmp", b"/dev/shm"):
        _mount(b"tmpfs", target, b"tmpfs", MS_NOSUID | MS_NODEV,
               f"size={TMP_BYTES},mode=0700{owner}".encode())
    # The folders leading to them must let the sandbox user in, whatever the grader's umask.
    umask = os.umask(0o022)
    for target, fd in held:
        source = f"/proc/self/fd/{fd}"
        if os.path.isdir(source):
            os.makedirs(target, mode=0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
            open(target, "ab").close()
        _mount(source.encode(), target.encode(), None, MS_BIND | MS_REC)
        os.close(fd)
    os.umask(umask)
    # Everything else that bwrap left writable is shared with the next worker: read-only here.
    # A remount must keep the mount's other flags (a user namespace may not clear them).
    kept = os.statvfs("/dev").f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)
    if os.statvfs("/dev").f_flag & os.ST_RELATIME:
        kept |= MS_RELATIME
    _mount(None, b"/dev", None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)


def _mounts_below(folder):
    """The outermost mount points inside ``folder`` (itself a mount point), from mountinfo."""
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split()[:5] for line in f]
    # Octal escapes (\040 for a space) in mount points; the last mount on a path is the visible one.
    unescape = lambda path: path.encode().decode("unicode_escape").encode("latin-1").decode()   # noqa: E731
    ids = [mount_id for mount_id, _, _, _, point in mounts if unescape(point) == folder]
    return [unescape(point) for _, parent, _, _, point in mounts if ids and parent == ids[-1]]


def _drop_capabilities():
    """Drop every capability the zygote's user namespace gave this process (capset, version 3)."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    if _libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _private_proc():
    """Mount a /proc of our own that shows the sandbox user only its own processes (hidepid=2),
    so no command line of the grader (`kata grade SUBMISSIONS --out OUT`) can be read from here.
    Needs CAP_SYS_ADMIN; a container without it keeps the shared /proc."""
    if _libc.unshare(CLONE_NEWNS) == 0 and _libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) == 0:
        _libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"hidepid=2")


if __name__ == "__main__":
    main(sys.argv)
